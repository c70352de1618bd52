"""Root pytest configuration: registers the control-plane fixtures for every test directory.

The fixtures (a real kube-apiserver + etcd + kube-controller-manager, session-scoped, and a namespace
per test) live in tests/controlplane/fixtures.py; see docs/controlplane.md.
"""

pytest_plugins = ["tests.controlplane.fixtures"]
