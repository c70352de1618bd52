"""Security tier: the operator's RBAC, the trainer's token, Pod Security, and what must never be written.

Shares the reliability tier's private control plane (``tests.reliability.isolated_plane``): these tests
run their own operator process and read its log, which the operator tier's shared cluster-wide operator
on the session plane would muddle. Every test here is marked ``controlplane``. The set-up (helper paths,
the plugin) is the reliability tier's own conftest, reused.
"""

from tests.reliability.conftest import pytest_configure  # noqa: F401  (a pytest hook: registers the plugin)
