# Sourced by the GPU scripts that start training processes (run_all.sh, run_fsdp.sh, i21_prefetch.sh and
# i21_alternate.sh's ladder runs).
# NVLink multicast stays off in every process (Ray workers inherit it from the Ray head started after this).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0
# One compile cache for every process of the call: the first compile fills it, later runs load it.
export TORCHINDUCTOR_CACHE_DIR=/tmp/trainop-inductor TRITON_CACHE_DIR=/tmp/trainop-triton
