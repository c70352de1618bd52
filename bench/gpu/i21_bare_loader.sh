#!/usr/bin/env bash
# Issue #21: how much of the trainer's 2-GPU gap does any real input path pay? Bare compiled DDP on data
# already on the GPU (`device`) against the same loop reading a DataLoader (`loader`: bare_ddp.py --data
# loader, 4 workers, pinned memory, the copy and normalisation on the training stream, as a hand-written loop
# does), alternating, over STEPS timed steps (default 700), and `launch`: the Trainer under torchrun with its
# step timeline (TRAINOP_TIMELINE_STEPS, bench/gpu/timeline_summary.py). Also the machine's CPU topology
# (topo.txt: lscpu, each CPU's SMT siblings, core and package; nvidia-smi topo -m). One device call:
#   run(command="bash bench/gpu/i21_bare_loader.sh", kind="nvidia-h200-x2", carry=[".whl"], timeout_s=560)
# RUNS (default `device loader launch device loader`), GPUS (2), STEPS (700), BUDGET_S (520).
source "$(dirname "$0")/call_start.sh"
GPUS=${GPUS:-2}
STEPS=${STEPS:-700}
BUDGET=${BUDGET_S:-520}
{
  lscpu; echo
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "$(basename "$c") siblings $(cat "$c/topology/thread_siblings_list") core $(cat "$c/topology/core_id")" \
      "package $(cat "$c/topology/physical_package_id")"
  done
  echo; nvidia-smi topo -m
} > "$O/topo.txt" 2>&1
if [ -d .whl ] && [ ! -d /tmp/site ]; then source bench/gpu/install_wheels.sh || exit 1; fi
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD/operator:$PWD/trainer_image${PYTHONPATH:+:$PYTHONPATH}
n=0
for run in ${RUNS:-device loader launch device loader}; do
  n=$((n + 1))
  if (( $(left "$BUDGET") < 90 )); then echo "== $n-$run skipped: $(left "$BUDGET") s left"; break; fi
  case $run in
    device|loader)
      (source bench/gpu/env.sh && timeout $(( $(left "$BUDGET") - 5 )) python3 -m torch.distributed.run --standalone \
        --nproc-per-node="$GPUS" bench/gpu/bare_ddp.py --workloads resnet50-compile --warmup 20 --steps "$STEPS" \
        --data "$run") > "$O/$n-$run.txt" 2>&1
      echo "== $n-$run done at $(( $(date +%s) - t0 )) s: $(grep '^BARE ' "$O/$n-$run.txt" \
        | grep -oE '"step_ms": [0-9.]+|"samples_per_second": [0-9.]+' | paste -sd' ')" ;;
    launch)
      TRAINOP_TIMELINE_STEPS=20:$STEPS TRAINOP_TIMELINE_DIR=$O/$n-launch/timeline OUT=$O/$n-launch \
        DEADLINE_S=$(( $(left "$BUDGET") - 5 )) bash bench/gpu/run_all.sh --gpus "$GPUS" --workloads resnet50-compile \
        --only "launch$GPUS-resnet50-compile" --diagnose-gpus 0 --recovery-gpus 0 --ab-variants '' --steps "$STEPS" \
        > "$O/$n-launch.txt" 2>&1
      echo "== $n-launch done at $(( $(date +%s) - t0 )) s: $(grep -E '^RESULT ' "$O/$n-launch.txt" \
        | grep -oE '"samples_per_second": [0-9.]+' | paste -sd' ')"
      python3 bench/gpu/timeline_summary.py "$O/$n-launch/timeline" > "$O/timeline-$n-launch.md" 2>&1
      head -40 "$O/timeline-$n-launch.md" ;;
    *) echo "== unknown run $run" ;;
  esac
done
echo "== total $(( $(date +%s) - t0 )) s"
# Only a few files come back from the device: everything goes into one archive.
(cd "$O" && tar -czf runs.tar.gz --remove-files [0-9]-* timeline-* topo.txt 2>/dev/null; true)
