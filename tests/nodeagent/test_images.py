"""The image map (``images.py``): lookup rules, the default trainop images, the file format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nodeagent import images


def _map() -> images.ImageMap:
    return images.ImageMap.from_json(
        {
            "images": {
                "registry.local:5000/team/app": {"cmd": ["repo"]},
                "registry.local:5000/team/app:pinned": {"cmd": ["exact"]},
                "quay.io/kuberay/*": {"cmd": ["short-prefix"]},
                "quay.io/kuberay/operator*": {"cmd": ["long-prefix"]},
            }
        }
    )


@pytest.mark.parametrize(
    ("reference", "cmd"),
    [
        ("registry.local:5000/team/app:pinned", ("exact",)),
        ("registry.local:5000/team/app:other", ("repo",)),
        ("registry.local:5000/team/app@sha256:abc", ("repo",)),
        ("registry.local:5000/team/app", ("repo",)),
        ("quay.io/kuberay/operator:v1.5.0", ("long-prefix",)),
        ("quay.io/kuberay/apiserver:v1.5.0", ("short-prefix",)),
    ],
)
def test_lookup_prefers_exact_then_repository_then_longest_prefix(
    reference: str, cmd: tuple[str, ...]
) -> None:
    image = _map().resolve(reference)
    assert image.cmd == cmd
    assert image.reference == reference


def test_a_reference_outside_the_map_is_an_image_pull_error() -> None:
    with pytest.raises(images.ImageNotFound, match=r"busybox:1\.36"):
        _map().resolve("busybox:1.36")


def test_the_default_map_runs_trainop_images_from_this_checkout_with_their_dockerfiles_settings() -> None:
    defaults = images.default_images()
    trainer = defaults.resolve("ghcr.io/trainop/trainer:0.1.0")
    assert trainer.entrypoint == ("python", "-m", "trainop_trainer")
    assert dict(trainer.env)["PYTHONUNBUFFERED"] == "1"
    assert trainer.user == "1000"
    assert trainer.bin_dir is not None and (trainer.bin_dir / "python").exists()
    operator = defaults.resolve(f"ghcr.io/trainop/operator:{images.IMAGE_TAG}")
    assert (operator.entrypoint, operator.cmd) == (("trainop",), ("operator",))
    assert operator.uid_gid() == (65532, 65532)


def test_a_tag_this_checkout_does_not_build_is_an_image_that_does_not_exist() -> None:
    with pytest.raises(images.ImageNotFound):
        images.default_images().resolve("ghcr.io/trainop/trainer:no-such-tag")


def test_image_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = images.write_image_file(tmp_path / "images.json", {"a": {"cmd": ["1"]}})
    image_file = images.ImageFile(path, defaults=images.ImageMap({}))
    assert image_file.current().resolve("a").cmd == ("1",)
    with pytest.raises(images.ImageNotFound):
        image_file.current().resolve("b")
    images.write_image_file(path, {"a": {"cmd": ["1"]}, "b": {"cmd": ["2"]}})
    path.touch()  # a rewrite within the file system's mtime granularity
    image_file._mtime = None
    assert image_file.current().resolve("b").cmd == ("2",)


@pytest.mark.parametrize(
    ("raw", "message"),
    [({"bogus": 1}, "unknown keys"), ({"paths": {"relative/path": "/x"}}, "absolute path")],
)
def test_bad_image_entries_are_refused_naming_the_problem(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        images.ImageMap.from_json(json.loads(json.dumps({"images": {"x": raw}})))


def test_the_beds_user_image_is_the_trainer_image_plus_the_code_its_dockerfile_copies() -> None:
    """tests/clusterbed/images.py's USER_IMAGE is what e2e/usercode/Dockerfile builds: FROM the trainer
    image, COPY of the code to USER_CODE_PATH, ENV PYTHONPATH there."""
    from tests.clusterbed import images as bed_images

    trainer = images.default_images().resolve(f"{images.TRAINER_REPOSITORY}:{images.IMAGE_TAG}")
    user = images.ImageMap.from_json({"images": {bed_images.USER_IMAGE: bed_images.user_image()}}).resolve(
        bed_images.USER_IMAGE
    )
    assert (user.entrypoint, user.cmd, user.user, user.working_dir, user.bin_dir) == (
        trainer.entrypoint,
        trainer.cmd,
        trainer.user,
        trainer.working_dir,
        trainer.bin_dir,
    )
    assert dict(user.env) == {**dict(trainer.env), "PYTHONPATH": bed_images.USER_CODE_PATH}
    assert dict(user.paths) == {**dict(trainer.paths), bed_images.USER_CODE_PATH: bed_images.USER_CODE_DIR}
    assert (bed_images.USER_CODE_DIR / "faulty_train.py").is_file()
    dockerfile = bed_images.USER_CODE_DIR / "Dockerfile"
    built = images.image_from_dockerfile(bed_images.USER_IMAGE, dockerfile, bin_dir=Path("/"))
    assert dict(built.env) == {"PYTHONPATH": bed_images.USER_CODE_PATH}
    copies = [line.split() for line in dockerfile.read_text().splitlines() if line.startswith("COPY ")]
    assert copies == [["COPY", "faulty_train.py", bed_images.USER_CODE_PATH + "/"]], copies
