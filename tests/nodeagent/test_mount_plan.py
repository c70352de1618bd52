"""The mount plan (``containers.plan_mounts``) for a checkout that lies under ``/tmp`` (a CI clone there): the
images' venv lives in it, so it is bound back over the container's private ``/tmp``, and bound back again when
the pod mounts a volume of its own over it (the operator's chart gives its pod a ``/tmp`` emptyDir: without
the second bind the operator's interpreter was missing and its pod exited 127).

A unit table: no container runs here (``test_pods.py`` runs them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nodeagent import containers, images, volumes


def _plan(tmp_path: Path, volume_mounts: list[dict[str, str]]) -> list[tuple[str, str | None]]:
    sandbox = containers.SandboxFiles(hosts=None, resolv_conf=None, hostname=tmp_path / "h", shm=tmp_path)
    plan = containers.plan_mounts(
        container={"name": "main", "volumeMounts": volume_mounts},
        identity=containers.Identity(uid=1000, gid=1000, groups=()),
        image=images.Image(reference="ghcr.io/trainop/operator:0.1.0"),
        sandbox=sandbox,
        pod_volumes={"tmp": volumes.HostVolume(name="tmp", path=tmp_path / "tmp-volume")},
        termination_log=tmp_path / "termination-log",
        bin_wrappers=None,
        env={},
    )
    return [(m.target, m.source) for m in plan.mounts]


@pytest.mark.parametrize(
    ("checkout", "volume_mounts", "binds_of_checkout", "last"),
    [
        ("/tmp/ci/trainop", [], 1, False),
        ("/tmp/ci/trainop", [{"name": "tmp", "mountPath": "/tmp"}], 2, True),
        ("/work/trainop", [{"name": "tmp", "mountPath": "/tmp"}], 0, False),
    ],
)
def test_a_checkout_under_tmp_stays_visible_under_a_pods_own_tmp_volume(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    checkout: str,
    volume_mounts: list[dict[str, str]],
    binds_of_checkout: int,
    last: bool,
) -> None:
    monkeypatch.setattr(images, "REPO_ROOT", Path(checkout))
    mounts = _plan(tmp_path, volume_mounts)
    assert sum(1 for target, source in mounts if target == checkout == source) == binds_of_checkout
    assert (mounts[-1] == (checkout, checkout)) == last
    if (
        volume_mounts
    ):  # the pod's /tmp volume comes after the container's private /tmp, as the last mount but one
        tmp_mounts = [index for index, (target, _) in enumerate(mounts) if target == "/tmp"]
        assert len(tmp_mounts) == 2 and tmp_mounts[-1] == len(mounts) - (2 if last else 1)


def test_a_checkout_directory_others_cannot_enter_comes_back_as_a_tmpfs_of_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mktemp -d`` makes a 0700 directory: a non-root container could not reach the venv inside it."""
    checkout = tmp_path / "clone"
    (checkout / ".venv").mkdir(parents=True)
    (checkout / "README.md").write_text("x")
    checkout.chmod(0o700)
    monkeypatch.setattr(images, "REPO_ROOT", checkout)
    mounts = _plan(tmp_path, [{"name": "tmp", "mountPath": "/tmp"}])
    entries = [(str(checkout / ".venv"),) * 2, (str(checkout / "README.md"),) * 2]
    first = mounts.index((str(checkout), ""))  # the tmpfs over the 0700 directory
    assert mounts[first + 1 : first + 3] == entries
    # ... and all of it again after the pod's own /tmp volume.
    assert mounts[-3:] == [(str(checkout), ""), *entries]
