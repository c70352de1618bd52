"""``python -m trainop_trainer.logtail``: the Ray head's training log, on a container's stdout.

Under KubeRay the RayJob's driver (``python -m trainop_trainer``) does not write to any container's
stdout: Ray's job manager sends its output to ``<ray temp dir>/session_latest/logs/job-driver-<id>.log`` on
the head, and the workers' output reaches that file too (Ray forwards every worker's lines to its driver,
prefixed ``(RayTrainWorker pid=..., ip=...)``; the trainer's own lines also carry ``rank<N>``). The
operator therefore runs this follower as a small second container of the head pod (``trainer-log``),
sharing the Ray temp dir, so that ``kubectl logs <head> -c trainer-log`` -- and ``kubectl trainop logs``,
any log collector, ``-f`` -- sees the whole job's log through the pods' log subresource.

It follows every file matching ``PATTERN`` (new ones included, e.g. a driver that starts later), from the
start, prints complete lines as they come, starts a file over when it shrinks (rotated or truncated), and
ends on SIGTERM. Standard library only: it must start in milliseconds and stay small (it runs for the whole
attempt next to Ray).
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys
import threading
from collections.abc import Callable
from typing import TextIO

DEFAULT_ROOT = "/tmp/ray"
DEFAULT_PATTERN = "session_latest/logs/job-driver-*.log"
POLL_SECONDS = 0.5


class Follower:
    """Follows the files under ``root`` matching ``pattern``; ``poll_once`` prints what is new."""

    def __init__(self, root: pathlib.Path, pattern: str, out: TextIO) -> None:
        self.root = root
        self.pattern = pattern
        self.out = out
        self._offsets: dict[pathlib.Path, int] = {}
        self._partial: dict[pathlib.Path, bytes] = {}

    def poll_once(self) -> int:
        """Print the complete lines written since the last call; returns how many."""
        printed = 0
        for path in sorted(self.root.glob(self.pattern)):
            try:
                size = path.stat().st_size
                offset = self._offsets.get(path, 0)
                if size < offset:  # rotated or truncated: read it from the start again
                    offset = 0
                    self._partial.pop(path, None)
                if size == offset:
                    continue
                with path.open("rb") as file:
                    file.seek(offset)
                    data = self._partial.pop(path, b"") + file.read(size - offset)
            except OSError:
                continue  # gone between glob and open
            self._offsets[path] = size
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            for line in lines:
                self.out.write(line.decode("utf-8", errors="replace") + "\n")
                printed += 1
        if printed:
            self.out.flush()
        return printed

    def flush_partial(self) -> None:
        """Print what is left without a newline (at the end)."""
        for rest in self._partial.values():
            self.out.write(rest.decode("utf-8", errors="replace") + "\n")
        self._partial.clear()
        self.out.flush()


def follow(
    root: pathlib.Path, pattern: str, out: TextIO, *, stop: threading.Event, poll_s: float = POLL_SECONDS
) -> None:
    follower = Follower(root, pattern, out)
    while not stop.is_set():
        follower.poll_once()
        stop.wait(poll_s)
    follower.poll_once()
    follower.flush_partial()


def main(argv: list[str] | None = None, *, install: Callable[..., object] = signal.signal) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainop_trainer.logtail",
        description="Print the Ray job driver's log (every rank's lines) as it grows, until SIGTERM.",
    )
    parser.add_argument(
        "root", nargs="?", default=DEFAULT_ROOT, help=f"Ray's temp dir (default {DEFAULT_ROOT})"
    )
    parser.add_argument(
        "--pattern", default=DEFAULT_PATTERN, help=f"files to follow (default {DEFAULT_PATTERN})"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    install(signal.SIGTERM, lambda *_: stop.set())
    install(signal.SIGINT, lambda *_: stop.set())
    follow(pathlib.Path(args.root), args.pattern, sys.stdout, stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
