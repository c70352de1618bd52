"""The machine-wide mountpoint registry (``mountpoints.py``): uses counted per bed, across beds.

Runs against the real registry in /run/trainop-bed (shared with any bed on the machine), on paths of
its own under a temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.clusterbed import network
from tests.nodeagent import mountpoints

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the registry lives in /run (root)")


def test_a_mountpoint_stays_while_any_bed_uses_it_and_goes_with_the_last(tmp_path: Path) -> None:
    first_bed, second_bed = network.BedNetwork.create(), network.BedNetwork.create()
    try:
        target = tmp_path / "var" / "run" / "secrets" / "token"
        first = mountpoints.Mountpoints(first_bed.bed_id)
        second = mountpoints.Mountpoints(second_bed.bed_id)
        first.acquire(str(target), kind="dir")
        second.acquire(str(target), kind="dir")  # exists already: counted, not made
        first.release(str(target))
        assert target.is_dir(), "removed while another bed's container is mounted on it"
        second.release(str(target))
        assert not (tmp_path / "var").exists()  # the parents it made go too
    finally:
        first_bed.destroy()
        second_bed.destroy()


def test_files_made_for_image_paths_go_and_preexisting_paths_stay(tmp_path: Path) -> None:
    bed = network.BedNetwork.create()
    try:
        registry = mountpoints.Mountpoints(bed.bed_id)
        existing = tmp_path / "existing"
        existing.mkdir()
        registry.acquire(str(existing / "manager"), kind="file")
        assert (existing / "manager").is_file()
        registry.acquire(str(existing), kind="dir")
        registry.release(str(existing / "manager"))
        registry.release(str(existing))
        assert existing.is_dir() and not (existing / "manager").exists()
    finally:
        bed.destroy()


def test_a_dead_beds_uses_are_dropped_by_the_next_agent_start(tmp_path: Path) -> None:
    bed = network.BedNetwork.create()
    dead_id = bed.bed_id
    target = tmp_path / "left" / "behind"
    mountpoints.Mountpoints(dead_id).acquire(str(target), kind="dir")
    written = tmp_path / "kept"
    mountpoints.Mountpoints(dead_id).acquire(str(written), kind="dir")
    (written / "data").write_text("a container wrote here")
    bed.destroy()  # the bed's owner is gone without releasing
    other = network.BedNetwork.create()
    try:
        removed = mountpoints.remove_leftovers(other.bed_id)
        assert str(target) in removed and not target.parent.exists()
        assert (written / "data").exists()  # not empty: never removed
    finally:
        other.destroy()
