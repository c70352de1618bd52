"""The image map: what an image reference means on this machine, since nothing is ever pulled.

Owns the ``--images`` JSON file format, its lookup rules, and the default map for this repository's own
images. A file looks like::

    {"images": {
       "ghcr.io/trainop/trainer": {"entrypoint": ["python", "-m", "trainop_trainer"], "cmd": [],
                                   "env": {"PYTHONUNBUFFERED": "1"}, "workingDir": "/", "user": "1000",
                                   "bin": "/work/main/.venv/bin",
                                   "paths": {"/manager": "/root/.cache/trainop/bin/kuberay-operator"}},
       "quay.io/kuberay/operator:*": {...}}}

Lookup of a reference such as ``ghcr.io/trainop/trainer:0.1.0``: the exact reference, then its repository
(the reference without ``:tag``/``@digest``), then the longest key ending in ``*`` that prefixes it. A miss
is an image pull error (``ErrImagePull`` then ``ImagePullBackOff``), exactly the path a typo takes on a
cluster. ``bin`` is a directory whose executables appear in ``/usr/local/bin`` of the container (as
exec wrappers, so a venv's ``python`` keeps finding its venv); ``paths`` maps absolute paths inside the
container to host files or directories, bind-mounted read-only.

The default map (``default_images``) points ``ghcr.io/trainop/trainer:<version>`` and
``ghcr.io/trainop/operator:<version>`` (this checkout's version; any other tag does not exist) at its
venv and takes ENV, ENTRYPOINT, CMD, WORKDIR and USER from the last stage of ``trainer_image/Dockerfile``
and ``operator/Dockerfile``. It does not read or start anything else.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINER_REPOSITORY = "ghcr.io/trainop/trainer"
OPERATOR_REPOSITORY = "ghcr.io/trainop/operator"
#: The tag of this checkout's images: the package version (pyproject.toml), which is the chart's appVersion.
IMAGE_TAG = importlib.metadata.version("trainop")


class ImageNotFound(LookupError):
    """The reference is not in the image map (the agent reports ErrImagePull)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Image:
    reference: str
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    working_dir: str = ""
    user: str = ""
    bin_dir: Path | None = None
    paths: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def from_json(cls, reference: str, raw: Mapping[str, Any]) -> Image:
        unknown = set(raw) - {"entrypoint", "cmd", "env", "workingDir", "user", "bin", "paths"}
        if unknown:
            raise ValueError(f"image {reference!r}: unknown keys {sorted(unknown)}")
        paths = raw.get("paths") or {}
        for target in paths:
            if not str(target).startswith("/"):
                raise ValueError(f"image {reference!r}: paths key {target!r} must be an absolute path")
        return cls(
            reference=reference,
            entrypoint=tuple(raw.get("entrypoint") or ()),
            cmd=tuple(raw.get("cmd") or ()),
            env=tuple((str(k), str(v)) for k, v in (raw.get("env") or {}).items()),
            working_dir=str(raw.get("workingDir") or ""),
            user=str(raw.get("user") or ""),
            bin_dir=Path(raw["bin"]) if raw.get("bin") else None,
            paths=tuple((str(target), Path(source)) for target, source in paths.items()),
        )

    def uid_gid(self) -> tuple[int | None, int | None]:
        """The numeric ``USER`` (``uid`` or ``uid:gid``); names are not resolved (no image /etc/passwd)."""
        if not self.user:
            return None, None
        uid, _, gid = self.user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise ValueError(f"image {self.reference!r}: user {self.user!r} must be numeric (uid[:gid])")
        return int(uid), int(gid) if gid else None


def repository_of(reference: str) -> str:
    """``ghcr.io/x/y:1.0`` -> ``ghcr.io/x/y`` (a registry port's colon is not a tag)."""
    name = reference.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


class ImageMap:
    """References to :class:`Image`; :meth:`resolve` raises :class:`ImageNotFound` for a miss."""

    def __init__(self, images: Mapping[str, Image]) -> None:
        self.images = dict(images)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ImageMap:
        return cls({key: Image.from_json(key, value) for key, value in (raw.get("images") or {}).items()})

    def resolve(self, reference: str) -> Image:
        for key in (reference, repository_of(reference)):
            if key in self.images:
                return dataclasses.replace(self.images[key], reference=reference)
        prefixes = [key for key in self.images if key.endswith("*") and reference.startswith(key[:-1])]
        if prefixes:
            return dataclasses.replace(self.images[max(prefixes, key=len)], reference=reference)
        raise ImageNotFound(f"image {reference!r} is not in the node agent's image map")

    def merged(self, other: ImageMap) -> ImageMap:
        """This map with ``other``'s entries added (``other`` wins)."""
        return ImageMap({**self.images, **other.images})


class ImageFile:
    """An ``--images`` file, re-read when it changes, so a test can add an image while pods back off."""

    def __init__(self, path: Path | None, *, defaults: ImageMap) -> None:
        self.path = path
        self.defaults = defaults
        self._mtime: float | None = None
        self._map = defaults

    def current(self) -> ImageMap:
        if self.path is None:
            return self._map
        mtime = self.path.stat().st_mtime
        if mtime != self._mtime:
            self._map = self.defaults.merged(ImageMap.from_json(json.loads(self.path.read_text())))
            self._mtime = mtime
        return self._map


# --------------------------------------------------------------------------- this repository's images
def _last_stage_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of the last ``FROM`` stage, continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    instructions = [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines
    ]
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from + 1 :]


def _exec_form(rest: str) -> list[str]:
    rest = rest.strip()
    if rest.startswith("["):
        return [str(word) for word in json.loads(rest)]
    return ["/bin/sh", "-c", rest]


def _env_pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if len(words) >= 1 and "=" not in words[0]:  # legacy "ENV KEY value"
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words)


def image_from_dockerfile(
    reference: str, dockerfile: Path, *, bin_dir: Path, skip_user: bool = False
) -> Image:
    """An :class:`Image` with the ENV, ENTRYPOINT, CMD, WORKDIR and USER of ``dockerfile``'s last stage."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    env: dict[str, str] = {}
    working_dir = ""
    user = ""
    for word, rest in _last_stage_instructions(dockerfile):
        if word == "ENV":
            env.update(_env_pairs(rest))
        elif word == "ENTRYPOINT":
            entrypoint, cmd = _exec_form(rest), []  # a new ENTRYPOINT resets CMD, as in Docker
        elif word == "CMD":
            cmd = _exec_form(rest)
        elif word == "WORKDIR":
            working_dir = rest.strip()
        elif word == "USER":
            user = rest.strip()
    return Image(
        reference=reference,
        entrypoint=tuple(entrypoint),
        cmd=tuple(cmd),
        env=tuple(env.items()),
        working_dir=working_dir,
        user="" if skip_user else user,
        bin_dir=bin_dir,
    )


def default_images(repo_root: Path = REPO_ROOT) -> ImageMap:
    """The trainop images on this checkout: its venv (``.venv/bin``, else the running interpreter's)."""
    venv_bin = repo_root / ".venv" / "bin"
    bin_dir = venv_bin if venv_bin.is_dir() else Path(sys.executable).parent
    images = {}
    for repository, dockerfile in (
        (TRAINER_REPOSITORY, repo_root / "trainer_image" / "Dockerfile"),
        (OPERATOR_REPOSITORY, repo_root / "operator" / "Dockerfile"),
    ):
        # Only the tag this checkout builds (its version: the chart's appVersion and the API's default
        # trainer image): any other tag is an image that does not exist, as in a registry.
        reference = f"{repository}:{IMAGE_TAG}"
        if dockerfile.is_file():
            images[reference] = image_from_dockerfile(reference, dockerfile, bin_dir=bin_dir)
        else:
            images[reference] = Image(reference=reference, bin_dir=bin_dir)
    return ImageMap(images)


def write_image_file(path: Path, images: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write an ``--images`` file (used by tests and the bed orchestration)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"images": images}, indent=2))
    os.replace(tmp, path)
    return path
