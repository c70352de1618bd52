"""Container log files: where they are and how ``kubectl logs`` reads them.

Owns the layout ``<state-dir>/pods/<ns>_<name>_<uid>/<container>/<restart>.log`` (one file per run of a
container, stdout and stderr interleaved as written) and reading it the way the kubelet serves
``/containerLogs``: the latest run or, with ``previous``, the run before it; ``tailLines`` and
``limitBytes``; ``follow`` until that run has ended. Lines carry no per-line timestamps (the process
writes the file directly, so nothing stands between it and its log), so ``timestamps``, ``sinceSeconds``
and ``sinceTime`` are not honoured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

_CHUNK = 64 * 1024


class LogNotFound(LookupError):
    pass


def runs(container_dir: Path) -> list[Path]:
    """The container's log files, oldest run first."""
    if not container_dir.is_dir():
        return []
    files = [p for p in container_dir.glob("*.log") if p.stem.isdigit()]
    return sorted(files, key=lambda p: int(p.stem))


def select(container_dir: Path, *, previous: bool, pod: str, container: str) -> Path:
    files = runs(container_dir)
    if previous:
        if len(files) < 2:
            raise LogNotFound(f'previous terminated container "{container}" in pod "{pod}" not found')
        return files[-2]
    if not files:
        raise LogNotFound(f'container "{container}" in pod "{pod}" is waiting to start')
    return files[-1]


def _tail_offset(path: Path, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of ``path`` start."""
    if lines <= 0:
        return path.stat().st_size
    with path.open("rb") as file:
        file.seek(0, 2)
        end = position = file.tell()
        found = 0
        while position > 0:
            step = min(_CHUNK, position)
            position -= step
            file.seek(position)
            block = file.read(step)
            if position + step == end and block.endswith(b"\n"):
                block = block[:-1]  # the final newline ends the last line, it does not start one
            for index in range(len(block) - 1, -1, -1):
                if block[index] == 0x0A:
                    found += 1
                    if found == lines:
                        return position + index + 1
    return 0


def read(
    path: Path,
    *,
    tail_lines: int | None,
    limit_bytes: int | None,
    follow: bool,
    still_running: Callable[[], bool],
    poll_s: float = 0.2,
) -> Iterator[bytes]:
    """Yield the log's bytes; with ``follow``, keep yielding until ``still_running`` turns False."""
    offset = _tail_offset(path, tail_lines) if tail_lines is not None else 0
    remaining = limit_bytes
    with path.open("rb") as file:
        file.seek(offset)
        while True:
            chunk = file.read(_CHUNK if remaining is None else min(_CHUNK, remaining))
            if chunk:
                yield chunk
                if remaining is not None:
                    remaining -= len(chunk)
                    if remaining <= 0:
                        return
                continue
            if not follow:
                return
            if not still_running():
                final = file.read() if remaining is None else file.read(remaining)
                if final:
                    yield final
                return
            time.sleep(poll_s)
