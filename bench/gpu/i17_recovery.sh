#!/usr/bin/env bash
# In-attempt recovery on 2 GPUs, side by side in one device call (issues #17 and #21, docs/benchmarks-gpu.md
# "Recovery in Ray Train's controller"):
#   run(command="bash bench/gpu/i17_recovery.sh", kind="nvidia-h100-x2", carry=[".whl"], timeout_s=590)
# Three ResNet-50 eager runs through the trainer, each killing rank 1 five steps after a checkpoint:
# 1. `policy/`: the default, trainop's failure policy inside Ray Train's controller (a new worker group);
# 2. `driver/`: TRAINOP_SWITCHES=restarts=driver, the loop before 2026-11-27 (fit() again: a new controller);
# 3. `pgshut3/`: the default with TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S=3 (Ray Train waits up to 30 s, its
#    default, for each worker's destroy_process_group; a surviving rank blocked in an NCCL all-reduce may
#    never answer).
# After each run Ray Train's controller logs (the worker group's shutdown and start, with their timings) are
# copied next to the run's results.
source "$(dirname "$0")/call_start.sh"
one() {  # NAME ENV...
  local name=$1; shift
  if (( $(left 570) < 100 )); then echo "== $name skipped: $(left 570) s left"; return; fi
  env "$@" OUT=$O/$name DEADLINE_S=$(( $(left 570) - 5 )) bash bench/gpu/run_all.sh --gpus 2 \
    --workloads resnet50 --only ray2-resnet50 --diagnose-gpus 0 --recovery-gpus 2 --ab-variants '' \
    > "$O/$name.txt" 2>&1
  cp /tmp/ray/session_latest/logs/train/ray-train-sys-controller-*.log "$O/$name/" 2>/dev/null
  echo "== $name ($*) done at $(( $(date +%s) - t0 )) s"
  grep -E "^RESULT .*recovery" "$O/$name.txt" | cut -c1-420
  grep -hoE '"asctime": "[^"]*", "levelname": "[A-Z]*", "message": "[^"]{0,90}' "$O/$name"/ray-train-sys-controller-*.log \
    | grep -E "FailurePolicy|shutdown|Shutting|Attempting|created in|initialized on|startup completed" | cut -c1-170
}
one policy TRAINOP_I17=policy
one driver TRAINOP_SWITCHES=restarts=driver
one pgshut3 TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S=3
echo "== total $(( $(date +%s) - t0 )) s"
