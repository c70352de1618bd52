"""A real Kubernetes control plane for trainop's integration tests, built from Go modules.

Public surface (import as modules, use names qualified):

- ``cluster.ControlPlane`` / ``cluster.ControlPlaneSettings``: start etcd + kube-apiserver (+ the
  controller-manager's garbage collector and namespace controllers) on loopback, install CRDs, tear down;
- ``assets``: where binaries come from (``KUBEBUILDER_ASSETS``, else ``~/.cache/trainop``) and building
  them with ``build.sh`` at the versions in ``versions.env``;
- ``fixtures``: the pytest plugin (``control_plane``, ``namespace``, marker ``controlplane``);
- ``python -m tests.controlplane``: a dev cluster for ``make dev-cluster``.

This package is test infrastructure: nothing under ``operator/`` or ``trainer_image/`` may import it.
See docs/controlplane.md.
"""
