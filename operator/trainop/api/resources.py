"""The size of a job's Ray pods when the spec leaves it open: resource defaults that fit the job. Pure.

``spec.workers`` may leave ``cpusPerWorker``, ``memoryPerWorker`` and ``sharedMemory`` unset; the pods are
then sized from what runs in them, and these functions say how. The operator's pod builder
(``trainop.controller.rayjob``), the trainer config the operator writes (``trainer_config.for_job``) and the
trainer's Ray Train scaling (``trainop_trainer.config.scaling_for``) all use them, so the pods and the Ray
resources asked for inside them agree. The field descriptions (``kubectl explain``) state the same rules.

Why a rule and not a CRD default: a static default is one size for every job; the one it replaced
(4 CPUs, 16 GiB, 8 GiB /dev/shm per worker) made the two-worker CPU demo ask for 36 GiB.

The rules, per worker pod (``n`` = ``dataset.numWorkers``, the DataLoader processes of each rank):

==============  ====================================  ================================================
                CPU workers (``gpusPerWorker: 0``)    GPU workers (``g`` GPUs, one rank each)
==============  ====================================  ================================================
cpus            ``1 + n``: the rank, its loaders      ``g * (2 + n)``: per rank also a core for CUDA
                                                      launches and NCCL's proxy thread
memory          ``2Gi + n * 512Mi``                   ``g * (12Gi + n * 2Gi)``: CUDA context, pinned
                                                      checkpoint snapshots, loaders of full-size batches
sharedMemory    half of memory                        half of memory
==============  ====================================  ================================================

``/dev/shm`` is memory-backed, so it is part of the pod's memory, not added to it. Half leaves room for
Ray's object store, which Ray sizes at 30 % of the pod's memory and places in /dev/shm only when it fits
there (otherwise it warns and falls back to disk), plus NCCL's intra-node buffers and DataLoader batches.

A CPU worker of the demo (one rank, no loaders) measured about 1.2 GiB of its processes' memory (the rank,
Ray's raylet, agents and one idle worker; docs/operator.md, "Pod sizes"). A GPU rank's figure (12 GiB plus
loaders) keeps the former 1-GPU default of 16 GiB for the default two loaders; bench/gpu/host_memory.py
measures it (not run yet).

This module must not import anything heavier than pydantic (both images import the API).
"""

from __future__ import annotations

import re

from trainop.api import trainingjob

GI = 1024**3
MI = 1024**2

CPU_WORKER_BASE_MEMORY = 2 * GI
CPU_WORKER_MEMORY_PER_LOADER = 512 * MI
GPU_RANK_BASE_MEMORY = 12 * GI
GPU_RANK_MEMORY_PER_LOADER = 2 * GI
# CPUs per GPU rank beyond its DataLoader workers: the training loop and CUDA/NCCL's host threads.
GPU_RANK_BASE_CPUS = 2

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_FACTORS = {
    None: 1,
    "m": 0.001,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity (the API's ``Quantity`` pattern: ``16Gi``, ``500M``, ``2``) in bytes."""
    match = _QUANTITY.match(quantity)
    if match is None:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity such as 16Gi, 500Mi or 2")
    number, suffix = match.groups()
    return int(float(number) * _FACTORS[suffix])


def format_bytes(value: int) -> str:
    """Bytes as the shortest exact binary quantity: ``2Gi``, ``1536Mi``, ``1000`` (plain bytes)."""
    for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def worker_cpus(spec: trainingjob.TrainingJobSpec) -> float:
    """CPUs of one worker pod: ``workers.cpusPerWorker``, else the rule in the module docstring."""
    workers = spec.workers
    if workers.cpus_per_worker is not None:
        return workers.cpus_per_worker
    loaders = spec.workload.dataset.num_workers
    if workers.gpus_per_worker == 0:
        return float(1 + loaders)
    return float(workers.gpus_per_worker * (GPU_RANK_BASE_CPUS + loaders))


def worker_memory(spec: trainingjob.TrainingJobSpec) -> str:
    """Memory of one worker pod: ``workers.memoryPerWorker``, else the rule in the module docstring."""
    workers = spec.workers
    if workers.memory_per_worker is not None:
        return workers.memory_per_worker
    loaders = spec.workload.dataset.num_workers
    if workers.gpus_per_worker == 0:
        return format_bytes(CPU_WORKER_BASE_MEMORY + loaders * CPU_WORKER_MEMORY_PER_LOADER)
    per_rank = GPU_RANK_BASE_MEMORY + loaders * GPU_RANK_MEMORY_PER_LOADER
    return format_bytes(workers.gpus_per_worker * per_rank)


#: A warm spare worker process (trainop_trainer.restart_policy.WarmSpares: torch, Ray Train and the trainer
#: imported, idle) peaks at ~0.7 GiB (2026-11-27, the 2-core dev box, CPU torch). A TrainingJob keeps one
#: per rank only where each rank has at least this much of its pod's memory: every GPU default (12 GiB and
#: up per rank), and a CPU job that asks for it; the CPU default (2 GiB a pod) would be too tight.
WARM_SPARE_MIN_MEMORY_PER_RANK = 4 * GI


def warm_spares(spec: trainingjob.TrainingJobSpec) -> bool:
    """Whether a TrainingJob keeps one warm spare process per rank: it restarts failed workers inside an
    attempt (``failurePolicy.maxWorkerFailures`` > 0; without that a spare is never used, and the preload it
    needs only slows every Ray worker's start) and its worker pods have room for them."""
    if spec.failure_policy.max_worker_failures == 0:
        return False
    ranks = max(1, spec.workers.gpus_per_worker)
    return quantity_bytes(worker_memory(spec)) >= ranks * WARM_SPARE_MIN_MEMORY_PER_RANK


def worker_shared_memory(spec: trainingjob.TrainingJobSpec) -> str:
    """/dev/shm of one worker pod: ``workers.sharedMemory``, else half of the pod's memory."""
    if spec.workers.shared_memory is not None:
        return spec.workers.shared_memory
    return half_of(worker_memory(spec))


def half_of(memory: str) -> str:
    """Half of a memory quantity, rounded down to whole MiB (the /dev/shm size of a pod of that memory)."""
    return format_bytes(quantity_bytes(memory) // 2 // MI * MI)


def resolved(spec: trainingjob.TrainingJobSpec) -> trainingjob.TrainingJobSpec:
    """``spec`` with the worker sizes written out, as the operator hands it to the trainer.

    A trainer image older than the operator fills a missing field with its own default; written out, the
    Ray resources it asks for are the pod's, whatever its defaults were."""
    workers = spec.workers.model_copy(
        update={
            "cpus_per_worker": worker_cpus(spec),
            "memory_per_worker": worker_memory(spec),
            "shared_memory": worker_shared_memory(spec),
        }
    )
    return spec.model_copy(update={"workers": workers})
