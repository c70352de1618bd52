"""The bed network (``tests/clusterbed/network.py``): address arithmetic, and real namespaces.

The integration tests create real network namespaces, veths and a bridge (root only); they never touch
the VM's own interfaces.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.clusterbed import network

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@pytest.mark.parametrize(
    ("num_nodes", "blocks"),
    [
        (1, ["10.244.7.0/24"]),
        (2, ["10.244.7.0/25", "10.244.7.128/25"]),
        (3, ["10.244.7.0/26", "10.244.7.64/26", "10.244.7.128/26"]),
        (16, [f"10.244.7.{16 * i}/28" for i in range(16)]),
    ],
)
def test_pod_cidr_is_split_into_one_block_per_node(num_nodes: int, blocks: list[str]) -> None:
    assert network.split_pod_cidr("10.244.7.0/24", num_nodes) == blocks


def test_more_than_16_nodes_do_not_fit_a_bed() -> None:
    with pytest.raises(ValueError, match="17 nodes"):
        network.split_pod_cidr("10.244.7.0/24", 17)


def test_pod_ips_skip_the_bridge_address() -> None:
    ips = list(network.pod_ips("10.244.7.0/26", gateway="10.244.7.1"))
    assert ips[0] == "10.244.7.2"
    assert ips[-1] == "10.244.7.62"
    assert len(ips) == 61


def test_bed_addresses_and_names() -> None:
    bed = network.BedAddresses(42)
    assert (bed.apiserver_ip, bed.node_ip, bed.gateway) == ("172.29.42.1", "172.29.42.2", "10.244.42.1")
    assert bed.netns == "trainop-b42"
    assert bed.pod_netns("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0") == "trainop-b42-0f1e2d3c"
    assert len(bed.pod_host_veth("0f1e2d3c-4b5a")) <= 15
    with pytest.raises(ValueError):
        network.BedAddresses(201)


def _serve_once_in(netns: str, ip: str, port: int) -> subprocess.Popen[str]:
    code = textwrap.dedent(
        f"""
        import socket
        server = socket.create_server(({ip!r}, {port}))
        print("listening", flush=True)
        connection, peer = server.accept()
        connection.sendall(("hello " + peer[0]).encode())
        """
    )
    process = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "listening"
    return process


def _connect_from(netns: str, ip: str, port: int) -> str:
    code = f"import socket; print(socket.create_connection(({ip!r}, {port}), timeout=10).recv(100).decode())"
    result = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@root_only
def test_pods_reach_each_other_and_the_apiserver_address_and_destroy_leaves_nothing() -> None:
    bed = network.BedNetwork.create()
    try:
        a, b = bed.addresses, bed.bed_id
        first = network.create_pod_network(a, pod_uid="aaaaaaaa-0001", pod_ip=f"10.244.{b}.2")
        second = network.create_pod_network(a, pod_uid="bbbbbbbb-0002", pod_ip=f"10.244.{b}.130")
        server = _serve_once_in(first.netns, first.ip, 8080)
        assert _connect_from(second.netns, first.ip, 8080) == f"hello {second.ip}"  # pod to pod, no NAT
        server.wait(timeout=10)

        # pod -> the root netns (where the apiserver binds), and the root netns -> a pod
        listener = socket.create_server((bed.apiserver_ip, 0))
        port = listener.getsockname()[1]
        accepted: list[str] = []

        def accept() -> None:
            connection, peer = listener.accept()
            accepted.append(peer[0])
            connection.sendall(b"from root")
            connection.close()

        thread = threading.Thread(target=accept)
        thread.start()
        assert _connect_from(first.netns, bed.apiserver_ip, port) == "from root"
        thread.join(timeout=10)
        listener.close()
        assert accepted == [first.ip]
        server = _serve_once_in(second.netns, second.ip, 9090)
        with socket.create_connection((second.ip, 9090), timeout=10) as connection:
            assert connection.recv(100).decode() == f"hello {bed.apiserver_ip}"
        server.wait(timeout=10)
    finally:
        bed.destroy()
    assert not [name for name in network.netns_names() if name.startswith(f"trainop-b{b}")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert f"tb{b}r" not in links
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert f"10.244.{b}.0/24" not in routes


@root_only
def test_a_crashed_beds_leftovers_and_processes_are_removed_by_the_next_start() -> None:
    # A child creates a bed and a pod netns with a process inside, then dies without cleaning up.
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        from tests.clusterbed import network
        bed = network.BedNetwork.create()
        ip = f"10.244.{bed.bed_id}.9"
        pod = network.create_pod_network(bed.addresses, pod_uid="cccccccc-0003", pod_ip=ip)
        subprocess.Popen(["ip", "netns", "exec", pod.netns, "sleep", "600"], start_new_session=True)
        while not network.ip("netns", "pids", pod.netns).stdout.split():
            time.sleep(0.02)
        print(bed.bed_id, flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        _crash_and_restart(child)
    finally:
        child.kill()
        child.wait()


def _crash_and_restart(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    crashed = int(child.stdout.readline())
    sleeper = subprocess.run(
        ["ip", "netns", "pids", f"trainop-b{crashed}-cccccccc"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert sleeper
    assert network.bed_is_live(crashed)
    assert crashed not in network.cleanup_leftovers()  # still held: left alone
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not network.bed_is_live(crashed)
    assert crashed in network.leftover_bed_ids()

    bed = network.BedNetwork.create()  # the next start
    try:
        assert crashed not in network.leftover_bed_ids() or bed.bed_id == crashed
        assert not [n for n in network.netns_names() if n.startswith(f"trainop-b{crashed}-")]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{sleeper[0]}"):
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{sleeper[0]}")
    finally:
        bed.destroy()


@root_only
def test_service_cidr_route_goes_to_one_bed_only_and_leaves_with_it() -> None:
    cidr = "10.255.254.0/24"  # not the clusters' 10.0.0.0/24: a concurrent session's bed may own that
    first = network.BedNetwork.create(service_cidr=cidr)
    try:
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
        assert f"{cidr} via {first.node_ip} dev tb{first.bed_id}r" in routes
        with pytest.raises(network.NetworkError, match="another bed has it"):
            network.BedNetwork.create(service_cidr=cidr)
    finally:
        first.destroy()
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert cidr not in routes
