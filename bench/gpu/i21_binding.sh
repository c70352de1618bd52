#!/usr/bin/env bash
# Issue #21, the device-binding question and a bare reference that loads its data, in one device call:
#   run(command="bash bench/gpu/i21_binding.sh", kind="nvidia-h100-x2", carry=[".whl"], timeout_s=590)
# 1. `bind/`: the suite with the trainer's default (each worker's process group set up on its own GPU,
#    trainop_trainer/ray_backend.py): bare DDP and the trainer, ResNet-50 eager, 2 then 1 GPU, recovery on 2.
# 2. `loader/`: bare_ddp.py --data loader (a DataLoader, pinned memory, the copy and the normalisation on the
#    training stream), ResNet-50 eager on 2 then 1 GPU: the bare reference with an input path.
# 3. `ray/`: the trainer on 2 GPUs with Ray's own backend (TRAINOP_RAY_DEVICE_BINDING=ray): the A side.
# 4. `iso/`: the trainer on 2 GPUs with the binding and TRAIN_ENABLE_SHARE_CUDA_VISIBLE_DEVICES=0 (each Ray
#    Train worker sees only its own GPU).
# NVML's process list per GPU is in each run's logs (logs.tar.gz, nvml.csv) and in the suite's table.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-$PWD/out/gpu}
mkdir -p "$O"
t0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - t0) )); }
OUT=$O/bind DEADLINE_S=300 bash bench/gpu/run_all.sh --gpus 1,2 --workloads resnet50 \
  --only bare2,ray2-resnet50,bare1,ray1-resnet50 --diagnose-gpus 0 --recovery-gpus 2 > "$O/bind.txt" 2>&1
echo "== bind done at $(( $(date +%s) - t0 )) s"; tail -40 "$O/bind/table.md" 2>/dev/null
(
  if [ -d .whl ]; then source bench/gpu/install_wheels.sh; fi
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  mkdir -p "$O/loader"
  for n in 2 1; do
    timeout 90 torchrun --standalone --nproc-per-node $n bench/gpu/bare_ddp.py --workloads resnet50 --data loader \
      --warmup 20 --steps 60 --out "$O/loader/results.jsonl" 2>&1 | grep -E "^BARE|Error|error" | tail -3
  done
) > "$O/loader.txt" 2>&1
echo "== loader done at $(( $(date +%s) - t0 )) s"; cat "$O/loader.txt"
if (( $(left 560) > 110 )); then
  TRAINOP_RAY_DEVICE_BINDING=ray OUT=$O/ray DEADLINE_S=$(( $(left 560) - 5 )) bash bench/gpu/run_all.sh --gpus 2 \
    --workloads resnet50 --only ray2-resnet50 --diagnose-gpus 0 --recovery-gpus 0 > "$O/ray.txt" 2>&1
  echo "== ray done at $(( $(date +%s) - t0 )) s"; tail -25 "$O/ray/table.md" 2>/dev/null
fi
if (( $(left 560) > 100 )); then
  TRAIN_ENABLE_SHARE_CUDA_VISIBLE_DEVICES=0 OUT=$O/iso DEADLINE_S=$(( $(left 560) - 5 )) bash bench/gpu/run_all.sh \
    --gpus 2 --workloads resnet50 --only ray2-resnet50 --diagnose-gpus 0 --recovery-gpus 0 > "$O/iso.txt" 2>&1
  echo "== iso done at $(( $(date +%s) - t0 )) s"; tail -25 "$O/iso/table.md" 2>/dev/null
fi
echo "== total $(( $(date +%s) - t0 )) s"
