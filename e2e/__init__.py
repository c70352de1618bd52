"""End-to-end scenarios: trainop driven the way a user drives it (docs/e2e.md).

``helm install`` of the chart, the operator running with the chart's ServiceAccount, ``kubectl apply -f`` of
a manifest, ``kubectl get trainingjobs --watch`` until the job is done, real Ray Train and torch DDP (gloo on
CPU). On this machine the cluster is the cluster bed (tests/clusterbed: the real control plane, scheduler,
kube-proxy, CoreDNS and KubeRay's own controller, with pods run by the node agent, the one declared
stand-in); with ``E2E_REAL_CLUSTER=1`` the same scenarios run against ``$KUBECONFIG`` (docs/real-cluster.md).

Modules:

- ``cluster``: the cluster under test (the local cluster bed with an audit log, or a real one) and the
  user's tools for it (kubectl, helm, ``kubectl create token``).
- ``install``: ``helm install`` of charts/trainop and the rollout of its operator Deployment.
- ``scenario``: one scenario's namespace, ``kubectl apply``, watches and timeline; scenarios' scripts run
  concurrently (``acts``, ``ScriptRun``).
- ``watch``: ``kubectl get --watch -o json`` streams, the CRDs' printer columns, timelines.
- ``faults``: failure injection through kubectl (a Ray Train worker or the entrypoint killed with
  ``kubectl exec``, a Ray pod deleted).
- ``claims``: reading what a job left on its checkpoint claim.
- ``audit``: the apiserver's audit log, to prove who wrote which status field.
"""
