"""End-to-end scenarios: trainop driven the way a user drives it (docs/e2e.md).

``helm install`` of the chart, the operator running with the chart's ServiceAccount, ``kubectl apply -f`` of
a manifest, ``kubectl get trainingjobs --watch`` until the job is done, real Ray Train and torch DDP (gloo on
CPU). On this machine the cluster is the test control plane (tests/controlplane) and KubeRay's controller is
replaced by ``kuberay_standin`` (the one stand-in, documented there); with ``E2E_REAL_CLUSTER=1`` the same
scenarios run against ``$KUBECONFIG`` with the real KubeRay (docs/real-cluster.md).

Modules:

- ``cluster``: the cluster under test (local control plane with an audit log, or a real one) and its tools.
- ``install``: ``helm install`` of charts/trainop and the operator, run as the chart's ServiceAccount.
- ``kuberay_standin``: the KubeRay stand-in program (``python -m e2e.kuberay_standin``) and its launcher.
- ``watch``: ``kubectl get --watch -o json`` streams, the CRD's printer columns, and scenario timelines.
- ``faults``: failure injection (a Ray Train worker killed, the RayJob's driver killed).
- ``audit``: reading the apiserver's audit log to prove who wrote which status field.
"""
