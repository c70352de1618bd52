"""A pod's volumes on the host: materialised under the pod's directory, refreshed, torn down.

Owns, per pod, ``<pod dir>/volumes/<name>`` for configMap, secret, downwardAPI, projected
(serviceAccountToken through the TokenRequest API bound to the pod, configMap, secret, downwardAPI) and
emptyDir (a directory; ``medium: Memory`` a tmpfs of ``sizeLimit``), plus the pod's shared ``/dev/shm``
tmpfs; and resolves hostPath (with its ``type`` checks) and persistentVolumeClaim (the claim's bound PV:
``hostPath`` or ``local``) to host paths. API-data volumes are written the kubelet's way (the atomic
writer: a timestamped directory, a ``..data`` symlink swapped with rename, one symlink per top-level
name), so :meth:`PodVolumes.refresh` can update them in place while containers read them, and tokens are
re-requested at 80 % of their lifetime. fsGroup: group ownership and setgid directories, as the kubelet
applies it to volumes that support ownership management.

It does not mount anything into containers (the runtime bind-mounts these paths) and never deletes
hostPath or PV data: teardown unmounts its own tmpfs mounts and removes only ``<pod dir>/volumes``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from . import env as env_module

JSON = dict[str, Any]
#: Docker's (and containerd's) default /dev/shm size.
DEFAULT_SHM_BYTES = 64 * 1024 * 1024
_TOKEN_REFRESH_FRACTION = 0.8


class VolumeError(RuntimeError):
    """A volume cannot be set up yet (missing object, unbound claim); reported as a FailedMount event."""


class VolumeApi(Protocol):
    """What volumes need from the apiserver (the node's identity; the Node authorizer allows exactly the
    objects referenced by pods bound to the node)."""

    def config_map(self, namespace: str, name: str) -> JSON | None: ...

    def secret(self, namespace: str, name: str) -> JSON | None: ...

    def service_account_token(
        self, namespace: str, service_account: str, *, audience: str | None, expiration_s: int, pod: JSON
    ) -> tuple[str, float]:
        """(token, expiry as epoch seconds)"""
        ...

    def persistent_volume_claim(self, namespace: str, name: str) -> JSON | None: ...

    def persistent_volume(self, name: str) -> JSON | None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostVolume:
    name: str
    path: Path
    #: The kubelet mounts API-data volumes read-only, whatever the volumeMount says.
    read_only: bool = False


# ------------------------------------------------------------------------------------------ helpers
def mount_tmpfs(target: Path, *, size_bytes: int | None, mode: str = "1777") -> None:
    target.mkdir(parents=True, exist_ok=True)
    options = f"mode={mode}" + (f",size={size_bytes}" if size_bytes else "")
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], check=True, capture_output=True
    )


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory`` (from /proc/self/mountinfo), deepest first."""
    prefix = str(directory).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as file:
        for line in file:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(mount_point)
    return sorted(set(found), key=len, reverse=True)


def unmount_all_under(directory: Path) -> None:
    for mount_point in mounts_under(directory):
        if subprocess.run(["umount", mount_point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], capture_output=True)


def _decode_items(
    data: Mapping[str, bytes], items: list[JSON] | None, default_mode: int, *, what: str, optional: bool
) -> dict[str, tuple[bytes, int]]:
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    files = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise VolumeError(f"{what} has no key {item['key']!r}")
        files[item["path"]] = (data[item["key"]], int(item.get("mode", default_mode)))
    return files


def _config_map_bytes(obj: JSON) -> dict[str, bytes]:
    data = {key: str(value).encode() for key, value in (obj.get("data") or {}).items()}
    data.update({key: base64.b64decode(value) for key, value in (obj.get("binaryData") or {}).items()})
    return data


def _secret_bytes(obj: JSON) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (obj.get("data") or {}).items()}


def write_atomic(directory: Path, files: Mapping[str, tuple[bytes, int]], *, gid: int | None = None) -> bool:
    """Make ``directory`` hold exactly ``files`` (relative path -> (content, mode)) the kubelet's way;
    return False when nothing changed."""
    directory.mkdir(parents=True, exist_ok=True)
    data_link = directory / "..data"
    if data_link.is_symlink() and _same_content(data_link, files):
        return False
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns() % 10**9}"
    stamp.mkdir()
    for relative, (content, mode) in files.items():
        path = stamp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
        if gid is not None:
            os.chown(path, -1, gid)
    if gid is not None:
        for dirpath, _, _ in os.walk(stamp):
            os.chown(dirpath, -1, gid)
    stamp.chmod(0o755)
    old = os.readlink(data_link) if data_link.is_symlink() else None
    tmp_link = directory / "..data_tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(stamp.name)
    os.replace(tmp_link, data_link)
    top_level = {relative.split("/", 1)[0] for relative in files}
    for name in top_level:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in top_level:
            entry.unlink()
    if old is not None:
        shutil.rmtree(directory / old, ignore_errors=True)
    return True


def _same_content(data_link: Path, files: Mapping[str, tuple[bytes, int]]) -> bool:
    current = data_link.resolve()
    present = {
        str(Path(dirpath, name).relative_to(current))
        for dirpath, _, names in os.walk(current)
        for name in names
    }
    if present != set(files):
        return False
    for relative, (content, mode) in files.items():
        path = current / relative
        if path.read_bytes() != content or stat.S_IMODE(path.stat().st_mode) != mode:
            return False
    return True


# --------------------------------------------------------------------------------------- the pod
class PodVolumes:
    """Volumes of one pod. Not thread-safe: only its pod worker calls it."""

    def __init__(
        self,
        *,
        pod: JSON,
        pod_dir: Path,
        api: VolumeApi,
        node_allocatable: Mapping[str, str],
    ) -> None:
        self.pod = pod
        self.root = pod_dir / "volumes"
        self.api = api
        self.node_allocatable = node_allocatable
        self._token_refresh_at: dict[str, float] = {}
        self.volumes: dict[str, HostVolume] = {}

    @property
    def _namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def _fs_group(self) -> int | None:
        value = (self.pod["spec"].get("securityContext") or {}).get("fsGroup")
        return int(value) if value is not None else None

    @property
    def shm_path(self) -> Path:
        return self.root / ".shm"

    def setup(self) -> dict[str, HostVolume]:
        """Materialise every volume (idempotent; raises :class:`VolumeError` for what is not ready)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.shm_path.is_dir() or str(self.shm_path) not in mounts_under(self.shm_path):
            mount_tmpfs(self.shm_path, size_bytes=DEFAULT_SHM_BYTES)
        for volume in self.pod["spec"].get("volumes") or []:
            if volume["name"] not in self.volumes:
                self.volumes[volume["name"]] = self._setup_one(volume, refresh=False)
        return self.volumes

    def refresh(self) -> None:
        """Rewrite API-data volumes whose objects changed; renew tokens due for it."""
        for volume in self.pod["spec"].get("volumes") or []:
            if volume["name"] in self.volumes and any(
                key in volume for key in ("configMap", "secret", "projected", "downwardAPI")
            ):
                with contextlib.suppress(VolumeError):
                    self._setup_one(volume, refresh=True)

    def teardown(self) -> None:
        unmount_all_under(self.root)
        if not mounts_under(self.root):
            shutil.rmtree(self.root, ignore_errors=True)
        self.volumes.clear()

    # ----------------------------------------------------------------------------------- per type
    def _setup_one(self, volume: JSON, *, refresh: bool) -> HostVolume:
        name = volume["name"]
        path = self.root / name
        if "emptyDir" in volume:
            return self._empty_dir(name, path, volume["emptyDir"] or {})
        if "hostPath" in volume:
            return HostVolume(name=name, path=_host_path(volume["hostPath"]))
        if "persistentVolumeClaim" in volume:
            return self._claim(name, volume["persistentVolumeClaim"])
        if "configMap" in volume:
            files = self._config_map_files(volume["configMap"])
        elif "secret" in volume:
            files = self._secret_files(volume["secret"])
        elif "downwardAPI" in volume:
            source = volume["downwardAPI"]
            files = self._downward_files(source.get("items") or [], int(source.get("defaultMode", 0o644)))
        elif "projected" in volume:
            files = self._projected_files(name, volume["projected"], refresh=refresh)
        else:
            kinds = sorted(set(volume) - {"name"})
            raise VolumeError(f"volume {name!r}: type {kinds} is not supported by the node agent")
        write_atomic(path, files, gid=self._fs_group)
        return HostVolume(name=name, path=path, read_only=True)

    def _empty_dir(self, name: str, path: Path, source: JSON) -> HostVolume:
        if not path.is_dir():
            if source.get("medium") == "Memory":
                size = source.get("sizeLimit")
                size_bytes = int(env_module.quantity(size)) if size else self._pod_memory_limit()
                mount_tmpfs(path, size_bytes=size_bytes, mode="0777")
            else:
                path.mkdir(parents=True)
            path.chmod(0o777)
            if self._fs_group is not None:
                os.chown(path, -1, self._fs_group)
                path.chmod(0o2777)
        return HostVolume(name=name, path=path)

    def _pod_memory_limit(self) -> int | None:
        limits = [
            ((c.get("resources") or {}).get("limits") or {}).get("memory")
            for c in self.pod["spec"]["containers"]
        ]
        if limits and all(limit is not None for limit in limits):
            return sum(int(env_module.quantity(limit)) for limit in limits)
        return None

    def _claim(self, name: str, source: JSON) -> HostVolume:
        claim_name = source["claimName"]
        claim = self.api.persistent_volume_claim(self._namespace, claim_name)
        if claim is None:
            raise VolumeError(f'persistentvolumeclaim "{claim_name}" not found')
        volume_name = (claim.get("spec") or {}).get("volumeName")
        if (claim.get("status") or {}).get("phase") != "Bound" or not volume_name:
            raise VolumeError(f'persistentvolumeclaim "{claim_name}" is not bound')
        pv = self.api.persistent_volume(volume_name)
        if pv is None:
            raise VolumeError(f'persistentvolume "{volume_name}" not found')
        spec = pv.get("spec") or {}
        if "hostPath" in spec:
            path = _host_path(spec["hostPath"])
        elif "local" in spec:
            path = Path(spec["local"]["path"])
            if not path.exists():
                raise VolumeError(f'persistentvolume "{volume_name}": local path {path} does not exist')
            if self._fs_group is not None:
                os.chown(path, -1, self._fs_group)
                path.chmod(path.stat().st_mode | stat.S_ISGID | 0o070)
        else:
            raise VolumeError(
                f'persistentvolume "{volume_name}": the node agent mounts only hostPath and local volumes'
            )
        return HostVolume(name=name, path=path, read_only=bool(source.get("readOnly")))

    def _config_map_files(self, source: JSON) -> dict[str, tuple[bytes, int]]:
        obj = self.api.config_map(self._namespace, source["name"])
        what = f'configmap "{source["name"]}"'
        if obj is None:
            if source.get("optional"):
                return {}
            raise VolumeError(f"{what} not found")
        return _decode_items(
            _config_map_bytes(obj),
            source.get("items"),
            int(source.get("defaultMode", 0o644)),
            what=what,
            optional=bool(source.get("optional")),
        )

    def _secret_files(self, source: JSON) -> dict[str, tuple[bytes, int]]:
        name = source.get("secretName") or source.get("name")
        obj = self.api.secret(self._namespace, str(name))
        what = f'secret "{name}"'
        if obj is None:
            if source.get("optional"):
                return {}
            raise VolumeError(f"{what} not found")
        return _decode_items(
            _secret_bytes(obj),
            source.get("items"),
            int(source.get("defaultMode", 0o644)),
            what=what,
            optional=bool(source.get("optional")),
        )

    def _downward_files(self, items: list[JSON], default_mode: int) -> dict[str, tuple[bytes, int]]:
        files = {}
        for item in items:
            try:
                if ref := item.get("fieldRef"):
                    value = env_module.field_value(self.pod, ref["fieldPath"])
                else:
                    ref = item["resourceFieldRef"]
                    value = env_module.resource_value(
                        self.pod, ref, default_container=None, node_allocatable=self.node_allocatable
                    )
            except env_module.EnvError as error:
                raise VolumeError(f"downwardAPI {item['path']}: {error}") from error
            files[item["path"]] = (value.encode(), int(item.get("mode", default_mode)))
        return files

    def _projected_files(self, name: str, source: JSON, *, refresh: bool) -> dict[str, tuple[bytes, int]]:
        default_mode = int(source.get("defaultMode", 0o644))
        files: dict[str, tuple[bytes, int]] = {}
        for index, projection in enumerate(source.get("sources") or []):
            if "serviceAccountToken" in projection:
                token_source = projection["serviceAccountToken"]
                key = f"{name}/{index}"
                path = token_source["path"]
                current = self.root / name / path
                if refresh and time.time() < self._token_refresh_at.get(key, 0) and current.exists():
                    files[path] = (current.read_bytes(), default_mode)
                    continue
                expiration = int(token_source.get("expirationSeconds", 3600))
                token, expiry = self.api.service_account_token(
                    self._namespace,
                    self.pod["spec"].get("serviceAccountName") or "default",
                    audience=token_source.get("audience") or None,
                    expiration_s=expiration,
                    pod=self.pod,
                )
                issued = time.time()
                self._token_refresh_at[key] = issued + (expiry - issued) * _TOKEN_REFRESH_FRACTION
                files[path] = (token.encode(), default_mode)
            elif "configMap" in projection:
                files.update(self._config_map_files({"defaultMode": default_mode, **projection["configMap"]}))
            elif "secret" in projection:
                files.update(self._secret_files({"defaultMode": default_mode, **projection["secret"]}))
            elif "downwardAPI" in projection:
                files.update(self._downward_files(projection["downwardAPI"].get("items") or [], default_mode))
            else:
                kinds = sorted(projection)
                raise VolumeError(
                    f"volume {name!r}: projected source {kinds} is not supported by the node agent"
                )
        return files


_HOST_PATH_CHECKS = {
    "Directory": (stat.S_ISDIR, "a directory"),
    "File": (stat.S_ISREG, "a file"),
    "Socket": (stat.S_ISSOCK, "a socket"),
    "CharDevice": (stat.S_ISCHR, "a character device"),
    "BlockDevice": (stat.S_ISBLK, "a block device"),
}


def _host_path(source: JSON) -> Path:
    path = Path(source["path"])
    kind = source.get("type") or ""
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True, mode=0o755)
    elif kind == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o644, exist_ok=True)
    elif kind in _HOST_PATH_CHECKS:
        check, noun = _HOST_PATH_CHECKS[kind]
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise VolumeError(f"hostPath type check failed: {path} does not exist") from None
        if not check(mode):
            raise VolumeError(f"hostPath type check failed: {path} is not {noun}")
    return path
