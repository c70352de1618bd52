"""End-to-end scenarios: trainop driven the way a user drives it (docs/e2e.md).

``helm install`` of the chart, the operator running with the chart's ServiceAccount, ``kubectl apply -f`` of
a manifest, ``kubectl get trainingjobs --watch`` until the job is done, real Ray Train and torch DDP (gloo on
CPU). On this machine the cluster is the test control plane (tests/controlplane) and KubeRay's controller is
replaced by ``kuberay_standin`` (the one stand-in, documented there); with ``E2E_REAL_CLUSTER=1`` the same
scenarios run against ``$KUBECONFIG`` with the real KubeRay (docs/real-cluster.md).

Modules:

- ``cluster``: the cluster under test (local control plane with an audit log, or a real one) and the
  user's tools for it (kubectl, helm, ``kubectl create token``).
- ``install``: ``helm install`` of charts/trainop; locally, the operator run as the chart's Deployment
  would run it, with the chart ServiceAccount's token.
- ``kuberay_standin``: the KubeRay stand-in (``python -m e2e.kuberay_standin``) and its launcher.
- ``scenario``: one scenario's namespace, ``kubectl apply``, watches and timeline; scenarios' scripts run
  concurrently (``acts``, ``ScriptRun``).
- ``watch``: ``kubectl get --watch -o json`` streams, the CRDs' printer columns, timelines.
- ``faults``: failure injection (a Ray Train worker killed, a RayJob's entrypoint killed).
- ``claims``: reading what a job left on its checkpoint claim.
- ``audit``: the apiserver's audit log, to prove who wrote which status field.
"""
