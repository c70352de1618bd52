"""The agent's own lifecycle: a crash and a restart (kill-and-report), an apiserver restart under it
(watches relist), and a stop that leaves nothing.

Uses its own bed (one node), because it kills the agent. Real parts as in test_pods.py.
"""

from __future__ import annotations

import json
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


def _registry() -> dict[str, dict[str, int]]:
    path = network.BED_DIR / "mountpoints.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _other_beds_have_pods(bed_id: int) -> bool:
    return any(
        name.startswith("trainop-b") and not name.startswith(f"trainop-b{bed_id}-") and name.count("-") == 2
        for name in network.netns_names()
    )


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as file:
        return [line.split()[4] for line in file if line.split()[4].startswith(str(path))]


def test_agent_crash_restart_and_apiserver_restart_are_survived_and_stop_leaves_nothing(
    control_plane_assets: assets.Assets,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the node agent needs root")
    host_paths = ("/var/run/secrets/kubernetes.io", "/dev/termination-log")
    existed = {path: Path(path).exists() for path in host_paths}
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

        # The apiserver goes away and comes back: the agent's watches relist and it keeps serving pods.
        bed.plane.restart("kube-apiserver", down_s=1)
        ns.pod(
            "after",
            node="solo",
            containers=[{"name": "main", "image": BUSYBOX, "command": ["true"]}],
            restartPolicy="Never",
        )
        ns.wait_phase("after", "Succeeded")
        ns.delete("pods/once")
        wait_for("the failed pod deleted through the agent", lambda: ns.pod_gone("once"))
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
    assert not [path for path, users in _registry().items() if users.get(str(bed_id))]
    if not _other_beds_have_pods(bed_id):  # the machine is shared: another bed may use the same paths
        assert {path: Path(path).exists() for path in host_paths} == existed
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert f"tb{bed_id}r" not in links
