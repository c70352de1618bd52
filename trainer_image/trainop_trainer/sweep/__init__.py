"""TuningSweep driver: Ray Tune over TorchTrainer runs of the packaged trainer.

``python -m trainop_trainer.sweep --config /etc/trainop/trainer.json`` is a sweep's RayJob entrypoint; it
reads a ``SweepConfig`` (``trainop.api.trainer_config.load_sweep``) and runs ``driver.run``. Modules, one
concern each (import modules, not names):

- ``__main__`` the thin entry point: read config -> join Ray -> run the sweep -> exit code
- ``driver``   the Tuner: search algorithm, scheduler, restore of an earlier attempt, the outcome
- ``space``    searchSpace -> Tune domains; sampled parameters -> a trial's TrainingJobSpec (no Ray)
- ``trial``    the Tune trial function: one TorchTrainer run of the packaged trainer per trial
- ``book``     counts by state and the best trial (pure)
- ``monitor``  the Tune callback that publishes status.trials/bestTrial, and the goal/failure stopper
- ``layout``   where a sweep keeps its files under the storage path (pure)
- ``local``    local mode (``run_sweep_manifest``) with a live table of trials

See docs/sweep.md.
"""
