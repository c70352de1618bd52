"""The control plane's data dirs left by killed runs are removed at the next start (real processes, real
files; no mocks)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.controlplane import cluster


def _data_dir(parent: Path, name: str, owner: str | None) -> Path:
    path = parent / f"trainop-controlplane-{name}"
    (path / "etcd").mkdir(parents=True)
    if owner is not None:
        (path / "owner").write_text(owner)
    return path


def test_only_dirs_whose_owner_process_is_gone_are_removed(tmp_path: Path) -> None:
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    me = cluster._process_identity(os.getpid())
    assert me is not None and me.startswith(f"{os.getpid()} ")
    dead = _data_dir(tmp_path, "dead", f"{dead_pid.pid} 1")
    reused = _data_dir(tmp_path, "reused", f"{os.getpid()} 1")  # our pid, another process's start time
    live = _data_dir(tmp_path, "live", me)
    kept = _data_dir(tmp_path, "kept", None)  # kept on purpose (keep_data_dir) or a failed start's logs
    other = tmp_path / "something-else"
    other.mkdir()

    removed = cluster.remove_leftovers(tmp_path)

    assert sorted(removed) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    assert live.exists() and kept.exists() and other.exists()
