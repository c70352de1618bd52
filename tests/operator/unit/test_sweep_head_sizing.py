"""A TuningSweep's Ray head is sized for its trial drivers and advertises the custom resource that pins
them there (docs/sweep.md, "Resources and sizing"); a TrainingJob's head is not."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import operator_factories as factories
import pytest

from trainop.controller import children, kinds


def head_group(body: dict[str, Any]) -> dict[str, Any]:
    (ray_job,) = [m for m in children.desired_children(kinds.parse(body), 1) if m["kind"] == "RayJob"]
    group: dict[str, Any] = ray_job["spec"]["rayClusterSpec"]["headGroupSpec"]
    return group


def sweep_head(max_concurrent_trials: int) -> dict[str, Any]:
    return head_group(factories.sweep(spec={"maxConcurrentTrials": max_concurrent_trials}))


@pytest.mark.parametrize(("trials", "memory"), [(1, "4Gi"), (2, "6Gi"), (8, "18Gi"), (1024, "2050Gi")])
def test_a_sweep_head_gets_2gib_plus_2gib_per_concurrent_trial(trials: int, memory: str) -> None:
    container = sweep_head(trials)["template"]["spec"]["containers"][0]  # the Ray container
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": memory},
        "limits": {"memory": memory},
    }


@pytest.mark.parametrize("trials", [1, 3, 16])
def test_a_sweep_head_advertises_one_trial_driver_slot_per_concurrent_trial_and_still_no_cpu(
    trials: int,
) -> None:
    assert sweep_head(trials)["rayStartParams"] == {
        "num-cpus": "0",
        "resources": f"'{{\"trainop_trial_driver\":{trials}}}'",
    }


def test_a_trainingjob_head_has_no_trial_driver_resource_and_its_own_size() -> None:
    head = head_group(factories.job())
    assert head["rayStartParams"] == {"num-cpus": "0"}
    container = head["template"]["spec"]["containers"][0]  # the Ray container
    assert container["resources"]["limits"] == {"memory": "4Gi"}


def ray_start_argv(params: dict[str, str]) -> list[str]:
    """The words bash hands `ray start` for these rayStartParams: KubeRay joins them as ``--key=value``
    (booleans aside) into the container's ``bash -lc`` command line."""
    line = "ray start --head " + " ".join(f"--{key}={value}" for key, value in sorted(params.items()))
    done = subprocess.run(
        ["bash", "-c", f'printf "%s\\0" {line}'], capture_output=True, text=True, check=True, timeout=10
    )
    return done.stdout.split("\0")[:-1]


def test_ray_start_reads_the_advertised_resource_and_the_trial_drivers_ask_for_it() -> None:
    from ray._private.utils import parse_resources_json
    from ray.autoscaler._private.cli_logger import cf, cli_logger

    from trainop_trainer.sweep import trial

    params = sweep_head(3)["rayStartParams"]
    argv = ray_start_argv(params)
    (flag,) = [word for word in argv if word.startswith("--resources=")]
    advertised = parse_resources_json(flag.removeprefix("--resources="), cli_logger, cf)  # Ray's own parser
    assert advertised == {"trainop_trial_driver": 3}
    assert "--num-cpus=0" in argv
    # KubeRay re-reads the value to add accelerators: it trims the shell quotes and unmarshals the JSON.
    assert json.loads(params["resources"].strip("'\"` ")) == advertised
    # The trainer's trial drivers then ask for one unit each (at most 3 at once, all on the head), no CPU.
    assert trial.driver_resources(advertised) == {"cpu": 0, "gpu": 0, "trainop_trial_driver": 1}
