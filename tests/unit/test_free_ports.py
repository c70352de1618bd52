"""The test beds' port picker: several ports for one process are all different (a process once got the same
port for its liveness and metrics listeners from two one-at-a-time picks, and could not start)."""

from __future__ import annotations

import socket

from tests.controlplane import processes


def test_ports_picked_together_are_all_different_and_free_to_bind() -> None:
    ports = processes.free_loopback_ports(64)
    assert len(set(ports)) == 64, ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[0]))  # released again once picked
    assert 0 < processes.free_loopback_port() < 65536
