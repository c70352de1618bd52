#!/usr/bin/env bash
# The whole GPU benchmark in one device call (docs/benchmarks-gpu.md):
#   run(command="bash bench/gpu/run_all.sh", kind="nvidia-h100-x2", carry=[".whl"], timeout_s=600)
# Issue #21 (the trainer within 1 % of bare DDP, with its profile, A/B blocks and recovery), 2 GPUs:
#   run(command="DEADLINE_S=520 bash bench/gpu/run_all.sh --gpus 1,2 --only bare2,ray2-resnet50,bare1,"
#       "ray1-resnet50,ray2-resnet50-compile,ray1-resnet50-compile,ray2-gpt-compile,ray1-gpt-compile,ladder2",
#       kind="nvidia-h100-x2", carry=[".whl"], timeout_s=580)
# and on 4 GPUs: --gpus 1,2,4 --diagnose-gpus 4 --recovery-gpus 4 with bare4/ray4-* for bare2/ray2-*, ladder4,
# kind="nvidia-h100-x4" (docs/benchmarks-gpu.md, "Issue #21").
# Writes $OUT/{log.txt,results.jsonl,table.md,summary.json,logs.tar.gz} (+ profile.md, profile.json and
# traces.tar.gz when a diagnostic pair ran) and prints the table last (after the profile).
# Extra arguments go to suite.py (e.g. --only bare1,ray1; --gpus 1,2,4,8; --workloads resnet50). DEADLINE_S
# (default 545) bounds the suite, counted from this script's start; phases that no longer fit are skipped
# and listed. The whole suite takes more than one call; split it: on 2 GPUs `--only bare1,bare2,ray2,ray1w8`
# and `--only allreduce,bare1,ray1,ckpt,launch2,launch1`; on 4 and 8 GPUs, one call per workload as
# docs/benchmarks-gpu.md ("4 and 8 GPUs") gives them. `suite.py --dry-run --assume-gpus 8 ...` prints a plan.
set -uo pipefail
t0=$(date +%s)
cd "$(dirname "$0")/../.."
source bench/gpu/env.sh  # NVLink multicast off, one compile cache
OUT=${OUT:-$PWD/out/gpu}
mkdir -p "$OUT"
{
  date -u; nvidia-smi -L; nvidia-smi topo -m
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  if [ -d .whl ]; then source bench/gpu/install_wheels.sh || exit 1; fi
  export PYTHONPATH=$PWD/operator:$PWD/trainer_image${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import pydantic, trainop_trainer.trainer; print('pydantic', pydantic.__version__)" || exit 1
  python3 -c "import ray.train.torch; print('ray', ray.__version__)" || echo "suite: Ray does not import: the Ray phases will fail"
  python3 bench/gpu/suite.py --out "$OUT" --t0 "$t0" --deadline-s "${DEADLINE_S:-545}" "$@"
} 2>&1 | tee "$OUT/log.txt"
