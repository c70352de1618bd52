"""The trainer's image input path, each part alone on an idle GPU (issue #21, round 18).

    python3 bench/gpu/input_kernels.py [--batch 256 --image 224 --reps 30]

Times with CUDA events, on one stream and nothing else running: the copy of a pinned uint8 batch to the
device (``workloads.ImageToDevice.transfer``), and its normalisation into bf16 channels_last by each
``switches`` ``input`` kernel (``fused``, ``lean``, ``f32``; ``ImageToDevice.finish``). Prints one
``INPUT_KERNELS {json}`` line: per part the median and minimum in ms, and the bytes it moves, so that what a
part costs beside the training step (``ladder.py``'s ``input-h2d`` and ``input-norm`` rungs) can be read
against what it takes alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch

from trainop_trainer import switches
from trainop_trainer.workloads import ImageToDevice


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    """ms of each of ``reps`` calls of ``fn``, after two untimed ones."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    host = torch.randint(0, 256, (args.batch, 3, args.image, args.image), dtype=torch.uint8).pin_memory()
    labels = torch.randint(0, 1000, (args.batch,)).pin_memory()
    to_device = ImageToDevice(channels_last=True, dtype=torch.bfloat16)
    on_device = to_device.transfer((host, labels), device)
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(device),
        "batch": [args.batch, 3, args.image, args.image],
        "uint8_mb": round(host.numel() / 1e6, 1),
    }
    parts: dict[str, Callable[[], object]] = {"h2d": lambda: to_device.transfer((host, labels), device)}
    for mode in switches.INPUT_MODES:

        def normalise(mode: str = mode) -> None:
            switches.apply({"input": mode})
            to_device.finish(on_device, device)

        parts[f"normalise-{mode}"] = normalise
    for name, fn in parts.items():
        times = timed(fn, args.reps)
        result[name] = {"median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4)}
    switches.reset()
    print("INPUT_KERNELS " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
