"""The agent's own lifecycle: a crash and a restart (kill-and-report), and a stop that leaves nothing.

Uses its own bed (one node), because it kills the agent. Real parts as in test_pods.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.clusterbed import network
from tests.controlplane import assets

from . import harness, kit
from .kit import BUSYBOX, Namespace, wait_for

pytestmark = pytest.mark.nodeagent


def _netns_of_bed(bed_id: int) -> list[str]:
    return [name for name in network.netns_names() if name.startswith(f"trainop-b{bed_id}-")]


def _cgroups_of_bed(bed_id: int) -> list[str]:
    found = []
    for controller in ("memory", "cpu", "pids"):
        top = Path("/sys/fs/cgroup") / controller / "trainop" / f"b{bed_id}"
        if top.exists():
            found += [str(path) for path in top.rglob("*") if path.is_dir()] + [str(top)]
    return found


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as file:
        return [line.split()[4] for line in file if line.split()[4].startswith(str(path))]


def test_a_restarted_agent_kills_and_reports_leftovers_and_stop_leaves_nothing(
    control_plane_assets: assets.Assets,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the node agent needs root")
    token_dir_existed = Path("/var/run/secrets/kubernetes.io").exists()
    bed = harness.AgentHarness(
        assets=control_plane_assets,
        settings=harness.HarnessSettings(nodes=({"name": "solo"},), images=kit.IMAGES, backoff_initial_s=1),
    )
    bed.start()
    try:
        assert bed.plane is not None and bed.bed is not None
        bed_id = bed.bed.bed_id
        ns = Namespace(bed, bed.plane.create_namespace())
        wait_for("the default ServiceAccount", lambda: ns.exists("serviceaccounts/default"))
        wait_for("kube-root-ca.crt", lambda: ns.exists("configmaps/kube-root-ca.crt"))
        memory = [{"name": "mem", "mountPath": "/mem"}]
        ns.pod(
            "survivor",
            node="solo",
            containers=[
                {"name": "main", "image": BUSYBOX, "command": ["sleep", "600"], "volumeMounts": memory}
            ],
            volumes=[{"name": "mem", "emptyDir": {"medium": "Memory"}}],
        )
        ns.pod(
            "once",
            node="solo",
            containers=[{"name": "main", "image": BUSYBOX, "command": ["sleep", "600"]}],
            restartPolicy="Never",
        )
        ns.wait_phase("survivor", "Running")
        ns.wait_phase("once", "Running")
        before = {p["name"]: p["containers"]["main"]["pids"] for p in bed.control.pods()}

        bed.kill_agent()
        # A crash leaves everything running: the next start has to clean it up.
        assert all(kit.process_alive(pid) for pids in before.values() for pid in pids)
        assert len(_netns_of_bed(bed_id)) == 2
        assert _mounts_under(bed.state_dir)

        bed.start_agent()
        assert not [pid for pids in before.values() for pid in pids if kit.process_alive(pid)]
        survivor = ns.wait_container(
            "survivor", "main", lambda s: s["restartCount"] == 1 and "running" in s["state"], "a restart"
        )
        last = survivor["lastState"]["terminated"]
        assert (last["exitCode"], last["reason"]) == (137, "Error")
        assert "node agent restarted" in last["message"]
        once = ns.wait_phase("once", "Failed")
        assert once["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
        assert len(_netns_of_bed(bed_id)) == 1  # the survivor's new sandbox; the old ones are gone
        running = next(p["containers"]["main"]["pids"] for p in bed.control.pods() if p["name"] == "survivor")
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- node agent log ---\n{bed.log_tail(80)}") from error
    finally:
        state_dir = bed.state_dir
        bed.stop()
    assert not [pid for pid in running if kit.process_alive(pid)]
    assert not _netns_of_bed(bed_id)
    assert not _cgroups_of_bed(bed_id)
    assert not _mounts_under(state_dir)
    assert Path("/var/run/secrets/kubernetes.io").exists() == token_dir_existed
    assert not Path("/dev/termination-log").exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert f"tb{bed_id}r" not in links
