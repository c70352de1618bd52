#!/usr/bin/env bash
# GPT-1.3B with FSDP2: bare reference, the trainer, the checkpoint stall, the batch-size finder, in one device
# call per GPU count (docs/benchmarks-gpu.md, "FSDP2"). Build .whl/ first (bench/gpu/prepare_wheels.sh), then:
#   run(command="bash bench/gpu/run_fsdp.sh", kind="nvidia-h100-x2", carry=[".whl"], timeout_s=600)
#   run(command="bash bench/gpu/run_fsdp.sh", kind="nvidia-h100-x4", carry=[".whl"], timeout_s=600)
# Writes $OUT/{log.txt,results.jsonl,table.md,logs.tar.gz} and prints the table last. Extra arguments go to
# fsdp_suite.py (e.g. --only bare2,launch2 --batch 8). DEADLINE_S (default 540) bounds the suite from this
# script's start; phases that no longer fit are skipped and listed.
set -uo pipefail
t0=$(date +%s)
cd "$(dirname "$0")/../.."
# NVLink multicast off in every process, one compile cache for the call (the bare run fills it, the
# trainer's run loads it): bench/gpu/env.sh.
source bench/gpu/env.sh
OUT=${OUT:-$PWD/out/fsdp}
mkdir -p "$OUT"
{
  date -u; nvidia-smi -L; nvidia-smi topo -m; df -h /tmp | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  if [ -d .whl ]; then source bench/gpu/install_wheels.sh || exit 1; fi
  export PYTHONPATH=$PWD/operator:$PWD/trainer_image${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import pydantic, trainop_trainer.trainer; print('pydantic', pydantic.__version__)" || exit 1
  python3 bench/gpu/fsdp_suite.py --out "$OUT" --t0 "$t0" --deadline-s "${DEADLINE_S:-540}" "$@"
} 2>&1 | tee "$OUT/log.txt"
