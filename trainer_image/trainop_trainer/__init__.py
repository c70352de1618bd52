"""trainop's packaged DDP trainer: ``python -m trainop_trainer`` trains a TrainerConfig on Ray Train.

Modules, one concern each (import modules, not names):

- ``__main__``   the thin entry point: read config -> start/join Ray -> train -> exit code
- ``config``     derived settings: Ray Train scaling, run paths, launch settings (no torch/ray)
- ``nccl``       network profile -> NCCL environment (pure; no torch/ray, the operator imports it)
- ``ray_train``  the TorchTrainer driver and the per-worker function
- ``runtime``    one worker's services: control channel, checkpoints, reports, metrics, status
- ``trainer``    the built-in train loop (Trainer.train_step / forward_backward_step / train)
- ``workloads``  built-in models and datasets
- ``user``       user entrypoints (``pkg.module:function``) and the context they get
- ``data``       resumable distributed sampler, loader, device prefetch
- ``checkpoint`` atomic, verified, pruned checkpoints written in the background
- ``distributed`` process-group facts, network set-up, all-reduce probe, control channel
- ``metrics``    Prometheus metrics (``metrics.REGISTRY``)
- ``status``     rank 0's status records -> CR status subresource / status.json
- ``preempt``    SIGTERM handling and the pod's preStop helper
- ``local``      local mode (``trainop run``)
- ``launch``     the same Trainer under torchrun, without Ray (baselines and benchmarks)
"""

__version__ = "0.1.0"
