"""Does a gloo peer blocked in DDP's gradient all-reduce give up when another rank fails? (issue #17)

    .venv/bin/python bench/cpu/gloo_peer_unblock.py MODE   # destroy | abort | shutdown | release | watch

Two processes (gloo, a 20 s process-group timeout), each with a DDP ``Linear(100, 100)`` and a second gloo
group (what trainop's control channel holds). Rank 1 raises at step 5; then, by MODE:

- ``destroy``: rank 1 calls ``destroy_process_group()``;
- ``abort``: rank 1 calls ``distributed_c10d._abort_process_group()``;
- ``shutdown``: rank 1 calls ``shutdown()`` on each of its groups, then ``destroy_process_group()``;
- ``release``: rank 1 clears the exception's frames, drops the model, destroys and collects garbage;
- ``watch``: rank 1 destroys; rank 0 has a thread that aborts its own groups once the store says one failed.

Both ranks then meet in a new process group (a ``PrefixStore`` over the same ``TCPStore``) and train again.
Prints when each rank saw the failure: a restart in place needs rank 0 to fail within a second, not after the
timeout. Measured results: docs/benchmarks.md, "In-attempt recovery, CPU".
"""

from __future__ import annotations

import datetime
import gc
import socket
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import distributed_c10d

MODES = ("destroy", "abort", "shutdown", "release", "watch")


def worker(rank: int, port: int, mode: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=30))
    for attempt in range(2):
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"pg-{attempt}", store),
            rank=rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=20),
        )
        control = dist.new_group(backend="gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(100, 100))
        stop = threading.Event()

        def watch(attempt: int = attempt, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                if store.add(f"failed-{attempt}", 0) > 0:
                    distributed_c10d._abort_process_group()
                    return
                time.sleep(0.05)

        if mode == "watch" and rank == 0:
            threading.Thread(target=watch, daemon=True).start()
        started = time.monotonic()
        try:
            for step in range(50):
                if rank == 1 and attempt == 0 and step == 5:
                    raise ValueError("a user's bug")
                model(torch.randn(8, 100)).sum().backward()
                dist.all_reduce(torch.zeros(1), group=control)
                time.sleep(0.01)
        except Exception as exc:
            waited = time.monotonic() - started
            print(f"rank {rank}: failed after {waited:.2f} s: {str(exc)[:90]}", flush=True)
            store.add(f"failed-{attempt}", 1)
            stop.set()
            if mode == "abort":
                distributed_c10d._abort_process_group()
            elif mode == "shutdown":
                for group in list(distributed_c10d._world.pg_names):
                    group.shutdown()
                dist.destroy_process_group()
            elif mode == "release":
                traceback.clear_frames(exc.__traceback__)
                del model, control
                dist.destroy_process_group()
                gc.collect()
            elif dist.is_initialized():
                dist.destroy_process_group()
            continue
        stop.set()
        print(f"rank {rank}: attempt {attempt} done", flush=True)
        dist.destroy_process_group()


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "destroy"
    if mode not in MODES:
        print(f"MODE must be one of {', '.join(MODES)}, not {mode!r}", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    mp.spawn(worker, args=(port, mode), nprocs=2)
    print(f"{mode}: both attempts done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
