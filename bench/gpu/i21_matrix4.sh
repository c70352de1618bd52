#!/usr/bin/env bash
# Issue #21 on 4 GPUs: bare DDP and the trainer for ResNet-50 eager and compiled and GPT-small compiled, all
# on 4 GPUs in one run, then ResNet-50 eager on 1 GPU for the scaling (docs/benchmarks-gpu.md, "Issue #21"):
#   run(command="bash bench/gpu/i21_matrix4.sh", kind="nvidia-h100-x4", carry=[".whl"], timeout_s=595)
# One suite call (one Ray head, one compile cache: the bare compiled runs fill it first).
source "$(dirname "$0")/call_start.sh"
OUT=$O/matrix4 DEADLINE_S=${DEADLINE_S:-575} bash bench/gpu/run_all.sh --gpus 1,4 \
  --workloads resnet50,resnet50-compile,gpt-compile \
  --only bare4,ray4-resnet50,ray4-resnet50-compile,ray4-gpt-compile,bare1,ray1-resnet50 \
  --diagnose-gpus 0 --recovery-gpus 0 --ab-variants '' > "$O/matrix4.txt" 2>&1
echo "== matrix4 done at $(( $(date +%s) - t0 )) s"
grep -E "^RESULT" "$O/matrix4.txt" | cut -c1-260
sed -n '/^Scaling/,$p' "$O/matrix4.txt" | head -40
# The device tool brings back only a few files: one archive of the suite's directory.
tar -czf "$O/matrix4.tar.gz" -C "$O" matrix4 && rm -rf "$O/matrix4"
