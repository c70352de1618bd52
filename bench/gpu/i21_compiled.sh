#!/usr/bin/env bash
# Issue #21: is the compiled ResNet-50 gap through the trainer (85.9 % on 4x H200, 2026-11-27 round 5) the
# report windows' lagged mode? One device call (docs/benchmarks-gpu.md, "Round 5"):
#   run(command="bash bench/gpu/i21_compiled.sh", kind="nvidia-h100-x4", carry=[".whl"], timeout_s=560)
# bare compiled DDP and the trainer (default: report_sync=lagged) on 4 GPUs, then the trainer with
# TRAINOP_SWITCHES=report_sync=device (every report waits for the GPU, as before 2026-11-27 06:31 UTC), then
# the default again (drift). One compile cache for all runs (run_all.sh). On a 2-GPU machine: GPUS=2.
source "$(dirname "$0")/call_start.sh"
GPUS=${GPUS:-4}
one() {  # NAME PHASES ENV...
  local name=$1 phases=$2; shift 2
  if (( $(left 540) < 100 )); then echo "== $name skipped: $(left 540) s left"; return; fi
  env "$@" OUT=$O/$name DEADLINE_S=$(( $(left 540) - 5 )) bash bench/gpu/run_all.sh --gpus "$GPUS" \
    --workloads resnet50-compile --only "$phases" --diagnose-gpus 0 --recovery-gpus 0 --ab-variants '' \
    > "$O/$name.txt" 2>&1
  echo "== $name ($*) done at $(( $(date +%s) - t0 )) s"
  grep -E '^RESULT .*"(impl": "bare"|samples_per_second)' "$O/$name.txt" | grep -oE '"impl": "[a-z]+"|"samples_per_second": [0-9.]+|"window_rates": \[[^]]*\]' | paste -sd' '
}
one lagged "bare$GPUS,ray$GPUS-resnet50-compile"
one device "ray$GPUS-resnet50-compile" TRAINOP_SWITCHES=report_sync=device
one lagged2 "ray$GPUS-resnet50-compile"
echo "== total $(( $(date +%s) - t0 )) s"
# The device tool brings back only a few files: one archive of every run's directory.
(cd "$O" && tar -czf runs.tar.gz --remove-files lagged device lagged2 2>/dev/null)
