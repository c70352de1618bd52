"""The NCCL environment builder: one table per profile, overrides win, ``auto`` follows the node's facts."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
import trainer_support

from trainop.api import nccl as api_nccl
from trainop.api import trainingjob
from trainop_trainer import nccl

IB = nccl.RdmaDevice(name="mlx5_0", port=1, link_layer="InfiniBand", active=True, driver="mlx5_core")
IB_DOWN = nccl.RdmaDevice(name="mlx5_1", port=1, link_layer="InfiniBand", active=False, driver="mlx5_core")
ROCE = nccl.RdmaDevice(name="mlx5_2", port=1, link_layer="Ethernet", active=True, driver="mlx5_core")
EFA = nccl.RdmaDevice(name="rdmap16s27", port=1, link_layer="Unknown", active=True, driver="efa")


@pytest.mark.parametrize("profile", ["nvlink", "infiniband", "roce", "efa", "tcp", "auto"])
def test_without_node_facts_each_profile_gets_exactly_the_api_table(profile: str) -> None:
    assert nccl.nccl_env(profile, {}, None) == api_nccl.profile_env(trainingjob.NetworkProfile(profile))


def test_the_api_tables_keep_profiles_apart() -> None:
    env = {p: nccl.nccl_env(p, {}, None) for p in ("tcp", "roce", "efa")}
    assert env["tcp"]["NCCL_IB_DISABLE"] == "1"
    assert (env["roce"]["NCCL_IB_DISABLE"], env["roce"]["NCCL_IB_GID_INDEX"]) == ("0", "3")
    assert env["efa"]["FI_PROVIDER"] == "efa"


def test_user_overrides_win_over_the_profile_and_are_added_to_it() -> None:
    env = nccl.nccl_env("tcp", {"NCCL_SOCKET_IFNAME": "eth1", "NCCL_DEBUG": "INFO"}, None)
    assert env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_IB_DISABLE"] == "1"


def test_auto_without_node_facts_adds_only_the_common_settings_and_the_overrides() -> None:
    env = nccl.nccl_env("auto", {"NCCL_ALGO": "Ring"}, None)
    assert env == {**api_nccl.profile_env(trainingjob.NetworkProfile.AUTO), "NCCL_ALGO": "Ring"}
    assert "NCCL_IB_DISABLE" not in env and "NCCL_P2P_LEVEL" not in env


@pytest.mark.parametrize(
    ("facts", "resolved"),
    [
        (nccl.NodeFacts(rdma_devices=(EFA,), gpu_count=8, nvlink_active_links=144), "efa"),
        (nccl.NodeFacts(fi_provider="efa"), "efa"),
        (nccl.NodeFacts(rdma_devices=(IB_DOWN, IB), gpu_count=8), "infiniband"),
        (nccl.NodeFacts(rdma_devices=(ROCE,), multi_node=True), "roce"),
        (nccl.NodeFacts(rdma_devices=(IB_DOWN,), gpu_count=1), "tcp"),
        (nccl.NodeFacts(gpu_count=8, nvlink_active_links=144, multi_node=False), "nvlink"),
        (nccl.NodeFacts(gpu_count=8, nvlink_active_links=144, multi_node=True), "tcp"),
        (nccl.NodeFacts(gpu_count=1, nvlink_active_links=0), "tcp"),
        (nccl.NodeFacts(), "tcp"),
    ],
)
def test_auto_resolves_the_fabric_from_node_facts(facts: nccl.NodeFacts, resolved: str) -> None:
    plan = nccl.plan("auto", {}, facts)
    assert plan.resolved == resolved
    assert plan.env == nccl.plan(resolved, {}, facts).env


def test_infiniband_lists_only_active_infiniband_ports_as_hcas() -> None:
    facts = nccl.NodeFacts(rdma_devices=(IB, IB_DOWN, ROCE))
    assert nccl.nccl_env("infiniband", {}, facts)["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert nccl.nccl_env("roce", {}, facts)["NCCL_IB_HCA"] == "=mlx5_2:1"


def test_an_explicit_profile_is_kept_whatever_the_node_looks_like() -> None:
    plan = nccl.plan("tcp", {}, nccl.NodeFacts(rdma_devices=(IB,)))
    assert (plan.resolved, plan.env["NCCL_IB_DISABLE"]) == ("tcp", "1")


def test_an_unknown_profile_is_refused_with_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="auto, nvlink, infiniband, roce, efa, tcp"):
        nccl.nccl_env("ethernet", {}, None)


def _fake_port(
    root: pathlib.Path, device: str, port: int, *, link_layer: str, state: str, driver: str
) -> None:
    """A /sys/class/infiniband tree laid out as the kernel lays it out (a real directory, no mocking)."""
    dev = root / "class" / "infiniband" / device
    (dev / "ports" / str(port)).mkdir(parents=True)
    (dev / "ports" / str(port) / "link_layer").write_text(link_layer + "\n")
    (dev / "ports" / str(port) / "state").write_text(state + "\n")
    drivers = root / "bus" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (dev / "device").mkdir()
    (dev / "device" / "driver").symlink_to(drivers)


def test_detect_node_facts_reads_rdma_ports_and_drivers_from_sysfs(tmp_path: pathlib.Path) -> None:
    _fake_port(tmp_path, "mlx5_0", 1, link_layer="InfiniBand", state="4: ACTIVE", driver="mlx5_core")
    _fake_port(tmp_path, "rdmap0", 1, link_layer="Unknown", state="4: ACTIVE", driver="efa")
    _fake_port(tmp_path, "mlx5_9", 1, link_layer="Ethernet", state="1: DOWN", driver="mlx5_core")
    facts = nccl.detect_node_facts(multi_node=True, sys_root=tmp_path, environ={})
    by_name = {d.name: d for d in facts.rdma_devices}
    assert by_name["mlx5_0"] == nccl.RdmaDevice("mlx5_0", 1, "InfiniBand", True, "mlx5_core")
    assert by_name["rdmap0"].is_efa and by_name["rdmap0"].active
    assert not by_name["mlx5_9"].active
    assert nccl.resolve_profile("auto", facts)[0] == "efa"


def test_detect_node_facts_on_a_machine_without_rdma_finds_none(tmp_path: pathlib.Path) -> None:
    facts = nccl.detect_node_facts(multi_node=False, sys_root=tmp_path, environ={"FI_PROVIDER": "tcp"})
    assert facts.rdma_devices == ()
    assert facts.fi_provider == "tcp"


def test_the_module_imports_without_torch_or_ray() -> None:
    code = (
        "import sys, trainop_trainer.nccl as n; n.nccl_env('roce', {}, None); "
        "heavy = [m for m in ('torch', 'ray', 'pynvml') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run([trainer_support.PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
