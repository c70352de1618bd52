#!/usr/bin/env bash
# Issue #21, round 4 (docs/benchmarks-gpu.md): where the 2-GPU gap goes, in one device call:
#   run(command="bash bench/gpu/i21_round4.sh", kind="nvidia-h100-x2", carry=[".whl"], timeout_s=595)
# 1. the CUDA tests of the report window and the input path (tests/trainer/test_trainer_cuda_window.py);
# 2. `main/`: bare and trainer, ResNet-50 eager, 2 then 1 GPU; on 2 GPUs A/B blocks in the same processes:
#    the default against `prefetch=repeat` (no copy, no normalisation: what the input path costs the GPU)
#    and `control_every=16` (what the per-step control exchange costs);
# 3. `one/`: the trainer on 1 GPU with the same A/B (the input path's cost without NCCL);
# 4. `prio/`: the trainer on 2 GPUs with TORCH_NCCL_HIGH_PRIORITY=1 (NCCL's streams at high priority, so
#    that the copy stream's normalisation does not delay an all-reduce), same A/B;
# 5. `omp/`: the trainer on 2 GPUs with OMP_NUM_THREADS=1 (bare DDP's value; Ray gives 4), if time is left.
source "$(dirname "$0")/call_start.sh"
cuda_tests
AB="default,prefetch=repeat,control_every=16"
OUT=$O/main DEADLINE_S=$(( $(left 560) - 290 )) bash bench/gpu/run_all.sh --gpus 1,2 --workloads resnet50 \
  --only bare2,ray2-resnet50,bare1,ray1-resnet50 --diagnose-gpus 2 --trace-steps 0 --recovery-gpus 0 \
  --ab-variants "$AB" --ab-rounds 2 > "$O/main.txt" 2>&1
echo "== main done at $(( $(date +%s) - t0 )) s"; grep -E "^RESULT" "$O/main.txt" | cut -c1-400
run_one() {  # NAME GPUS ENV...: one trainer run with the A/B
  local name=$1 gpus=$2; shift 2
  if (( $(left 560) < 95 )); then echo "== $name skipped: $(left 560) s left"; return; fi
  env "$@" OUT=$O/$name DEADLINE_S=$(( $(left 560) - 5 )) bash bench/gpu/run_all.sh --gpus "$gpus" \
    --workloads resnet50 --only "ray$gpus-resnet50" --diagnose-gpus "$gpus" --trace-steps 0 --recovery-gpus 0 \
    --ab-variants "$AB" --ab-rounds 2 > "$O/$name.txt" 2>&1
  echo "== $name ($*) done at $(( $(date +%s) - t0 )) s"; grep -E "^RESULT" "$O/$name.txt" | cut -c1-300
}
run_one one 1 TRAINOP_ROUND4=one
run_one prio 2 TORCH_NCCL_HIGH_PRIORITY=1
run_one omp 2 OMP_NUM_THREADS=1
echo "== total $(( $(date +%s) - t0 )) s"
