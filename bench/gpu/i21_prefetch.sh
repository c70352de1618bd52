#!/usr/bin/env bash
# Issue #21, round 3 (docs/benchmarks-gpu.md): the whole 1/2-GPU comparison with an A/B of the trainer's prefetch
# (switches.py: `prefetch=eager`, the default, against `prefetch=after`; `after` was the default when it ran) in the same
# processes, then the bare reference that loads its data (bare_ddp.py --data loader), in one device call:
#   run(command="bash bench/gpu/i21_prefetch.sh", kind="nvidia-h100-x2", carry=[".whl"], timeout_s=590)
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-$PWD/out/gpu}
mkdir -p "$O"
t0=$(date +%s)
OUT=$O/suite DEADLINE_S=${SUITE_S:-470} bash bench/gpu/run_all.sh --gpus 1,2 --ab-variants default,prefetch=after \
  --only bare2,ray2-resnet50,bare1,ray1-resnet50,ray2-resnet50-compile,ray1-resnet50-compile,ray2-gpt-compile,ray1-gpt-compile,ladder2 \
  > "$O/suite.txt" 2>&1
echo "== suite done at $(( $(date +%s) - t0 )) s"
(
  if [ -d .whl ]; then source bench/gpu/install_wheels.sh; fi
  source bench/gpu/env.sh
  for n in 2 1; do
    timeout $(( (${LOADER_S:-90}) / 2 )) torchrun --standalone --nproc-per-node $n bench/gpu/bare_ddp.py \
      --workloads resnet50 --data loader --warmup 20 --steps 60 --out "$O/loader.jsonl" 2>&1 \
      | grep -E "^BARE|Error" | tail -4
  done
) > "$O/loader.txt" 2>&1
echo "== loader done at $(( $(date +%s) - t0 )) s"; cat "$O/loader.txt"
cat "$O/suite/table.md" 2>/dev/null || tail -60 "$O/suite.txt"
