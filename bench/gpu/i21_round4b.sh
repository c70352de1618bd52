#!/usr/bin/env bash
# Issue #21, round 4, second call (docs/benchmarks-gpu.md): what synchronises, and DDP's bucket views:
#   run(command="bash bench/gpu/i21_round4b.sh", kind="nvidia-h100-x2", carry=[".whl"], timeout_s=420)
# 1. the CUDA tests (tests/trainer/test_trainer_cuda_window.py) and whether a 0-dim pinned copy synchronises;
# 2. `hunt/`: bare and trainer, ResNet-50 eager, 2 GPUs; the trainer with TRAINOP_SYNC_DEBUG_STEPS=40:25
#    (every stack that made the host wait for the GPU, logged once per rank; its timing is not a result);
# 3. `view/`: the trainer on 2 GPUs with TRAINOP_SWITCHES=bucket_view=off (DDP's default, as bare DDP).
source "$(dirname "$0")/call_start.sh"
(
  if [ -d .whl ]; then source bench/gpu/install_wheels.sh; fi
  export PYTHONPATH=$PWD/operator:$PWD/trainer_image${PYTHONPATH:+:$PYTHONPATH}
  timeout 120 python3 -m pytest -o addopts= --noconftest -p no:cacheprovider -q tests/trainer/test_trainer_cuda_window.py
  timeout 60 python3 - <<'PY'
import torch
src = torch.ones((), device="cuda")
for shape in ((), (1,)):
    host = torch.empty(shape, dtype=torch.float32, pin_memory=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(300_000_000)
    torch.cuda.set_sync_debug_mode("error")
    try:
        host.copy_(src.reshape(shape), non_blocking=True)
        print(f"pinned copy of shape {shape}: no sync")
    except RuntimeError as exc:
        print(f"pinned copy of shape {shape}: SYNCS ({str(exc)[:80]})")
    finally:
        torch.cuda.set_sync_debug_mode("default")
PY
) > "$O/pytest.txt" 2>&1
echo "== cuda tests done at $(( $(date +%s) - t0 )) s"; tail -8 "$O/pytest.txt"
TRAINOP_SYNC_DEBUG_STEPS=40:25 OUT=$O/hunt DEADLINE_S=$(( $(left 400) - 110 )) bash bench/gpu/run_all.sh --gpus 2 \
  --workloads resnet50 --only bare2,ray2-resnet50 --diagnose-gpus 0 --recovery-gpus 0 > "$O/hunt.txt" 2>&1
echo "== hunt done at $(( $(date +%s) - t0 )) s"; grep -E "^RESULT" "$O/hunt.txt" | cut -c1-300
mkdir -p "$O/hunt/x" && tar -xzf "$O/hunt/logs.tar.gz" -C "$O/hunt/x" 2>/dev/null
grep -rh -A14 "sync point on rank\|sync hunt on rank" "$O/hunt/x" | head -150
if (( $(left 400) > 95 )); then
  TRAINOP_SWITCHES=bucket_view=off OUT=$O/view DEADLINE_S=$(( $(left 400) - 5 )) bash bench/gpu/run_all.sh --gpus 2 \
    --workloads resnet50 --only ray2-resnet50 --diagnose-gpus 0 --recovery-gpus 0 > "$O/view.txt" 2>&1
  echo "== view done at $(( $(date +%s) - t0 )) s"; grep -E "^RESULT" "$O/view.txt" | cut -c1-300
fi
echo "== total $(( $(date +%s) - t0 )) s"
