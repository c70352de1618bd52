#!/usr/bin/env bash
# In-attempt recovery on 2 and 4 GPUs, side by side in one device call (issues #17 and #21,
# docs/benchmarks-gpu.md "Recovery in Ray Train's controller"):
#   run(command="bash bench/gpu/i17_recovery.sh", kind="nvidia-h100-x4", carry=[".whl"], timeout_s=590)
#   run(command="RUNS='spares2 policy2 spares4' CUDA_TESTS=1 BUDGET_S=470 bash bench/gpu/i17_recovery.sh", ...)
# ResNet-50 eager runs through the trainer, each killing one rank five steps after a checkpoint:
# 1. `policy2/`, `policy4/`: the default, trainop's failure policy inside Ray Train's controller (a new
#    worker group), on 2 and on 4 GPUs;
# 2. `graceful2/`: TRAINOP_SWITCHES=failed_group=graceful, Ray Train's own shutdown of the failed group (up to
#    5 s for a worker that cannot answer) instead of trainop's FailedGroupStopper (since 2026-11-27 18:00);
# 3. `driver2/`: TRAINOP_SWITCHES=restarts=driver, the loop before 2026-11-27 (fit() again: a new controller);
# 4. `pgshut2/`: the default with TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S=3 (Ray Train waits up to 30 s, its
#    default, for each worker's destroy_process_group; a surviving rank blocked in an NCCL all-reduce may
#    never answer).
# After each run Ray Train's controller logs (the worker group's shutdown and start, with their timings) are
# copied next to the run's results. On a 2-GPU machine the 4-GPU run is skipped (suite.py drops it).
# Then, if time is left, the host-side A/B of issue #21's 2-GPU gap (`env_ab`): bare DDP with and without
# the environment the trainer's workers run under (NCCL profile env, OMP_NUM_THREADS=4 as Ray sets it).
source "$(dirname "$0")/call_start.sh"
BUDGET=${BUDGET_S:-575}
one() {  # NAME GPUS ENV...
  local name=$1 gpus=$2; shift 2
  if (( $(left "$BUDGET") < 110 )); then echo "== $name skipped: $(left "$BUDGET") s left"; return; fi
  env "$@" OUT=$O/$name DEADLINE_S=$(( $(left "$BUDGET") - 5 )) bash bench/gpu/run_all.sh --gpus "$gpus" \
    --workloads resnet50 --only "ray$gpus-resnet50" --diagnose-gpus 0 --recovery-gpus "$gpus" --ab-variants '' \
    > "$O/$name.txt" 2>&1
  cp /tmp/ray/session_latest/logs/train/ray-train-sys-controller-*.log "$O/$name/" 2>/dev/null
  echo "== $name ($gpus GPUs; $*) done at $(( $(date +%s) - t0 )) s"
  grep -E "^RESULT .*recovery" "$O/$name.txt" | cut -c1-420
  grep -hoE '"asctime": "[^"]*", "levelname": "[A-Z]*", "message": "[^"]{0,90}' "$O/$name"/ray-train-sys-controller-*.log \
    | grep -E "FailurePolicy|trainop:|shutdown|Shutting|Attempting|created in|initialized on|startup completed" | cut -c1-170
}
# RUNS picks and orders them; BUDGET_S (default 575 s) cuts the tail: the first call (17:31 UTC, before the
# stopper) ran policy2, policy4, driver2 and pgshut2; the second (BUDGET_S=450) policy2, policy4, graceful2.
# `spares2`/`spares4`: warm spare workers (restart_policy.WarmSpares, as on a TrainingJob's pods with room),
# started 5 s after each group instead of 20 (the kill comes ~14 s after the group starts).
# CUDA_TESTS=1 first runs tests/trainer/test_trainer_cuda_window.py (pytest.txt).
if [ "${CUDA_TESTS:-0}" = 1 ]; then cuda_tests; fi
SPARES=(TRAINOP_WARM_SPARES=1 TRAINOP_SPARE_DELAY_S=5)
for run in ${RUNS:-policy2 policy4 graceful2 driver2 pgshut2}; do
  case $run in
    policy2) one policy2 2 TRAINOP_I17=policy ;;
    policy4) one policy4 4 TRAINOP_I17=policy ;;
    spares2) one spares2 2 "${SPARES[@]}" ;;
    spares4) one spares4 4 "${SPARES[@]}" ;;
    graceful2) one graceful2 2 TRAINOP_SWITCHES=failed_group=graceful ;;
    driver2) one driver2 2 TRAINOP_SWITCHES=restarts=driver ;;
    pgshut2) one pgshut2 2 TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S=3 ;;
    *) echo "== unknown run $run" ;;
  esac
done
if [ -z "${RUNS:-}" ] && (( $(left "$BUDGET") > 80 )); then
  # bare DDP, 2 GPUs, three times: default env, the trainer's worker env, default again (drift check).
  for variant in plain workerenv plain2; do
    (( $(left "$BUDGET") > 30 )) || break
    envs=()
    [ "$variant" = workerenv ] && envs=(NCCL_P2P_LEVEL=NVL NCCL_IB_DISABLE=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1 NCCL_DEBUG=WARN OMP_NUM_THREADS=4)
    env "${envs[@]}" OUT=$O/env_ab_$variant DEADLINE_S=$(( $(left "$BUDGET") - 3 )) bash bench/gpu/run_all.sh --gpus 2 \
      --workloads resnet50 --only bare2 --diagnose-gpus 0 --recovery-gpus 0 > "$O/env_ab_$variant.txt" 2>&1
    echo "== env_ab $variant: $(grep -E '^RESULT .*"impl": "bare"' "$O/env_ab_$variant.txt" | grep -oE '"samples_per_second": [0-9.]+')"
  done
fi
echo "== total $(( $(date +%s) - t0 )) s"
# The device tool brings back only a few files: one archive of every run's directory.
(cd "$O" && tar -czf runs.tar.gz --remove-files policy2 policy4 spares2 spares4 graceful2 driver2 pgshut2 env_ab_* 2>/dev/null; true)
