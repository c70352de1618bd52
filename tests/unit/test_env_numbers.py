"""The trainer's numeric environment variables: one parser, one sentence naming the variable,
and ``TRAINOP_RAY_REPORT_MIN_INTERVAL_S`` handed from the driver to its Ray workers (worker pods do not
share the driver pod's environment)."""

from __future__ import annotations

import pytest

from trainop.api import trainer_config
from trainop_trainer import config, ray_train, step_schedule


@pytest.mark.parametrize("raw", ["abc", "", "  ", "-1", "nan", "inf", "1e400"])
def test_a_bad_stop_grace_names_the_variable_the_value_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(config.STOP_GRACE_ENV, raw)
    if not raw.strip():
        assert config.stop_grace_from_env(25.0) == 25.0  # unset or empty: the default
        return
    with pytest.raises(ValueError) as caught:
        config.stop_grace_from_env(25.0)
    assert str(caught.value) == (
        f"TRAINOP_STOP_GRACE_S must be a number of seconds >= 0, got {raw!r}; fix it, or unset it for the "
        "default, 25"
    )


def test_good_values_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.STOP_GRACE_ENV, " 2.5 ")
    assert config.stop_grace_from_env(60.0) == 2.5
    monkeypatch.setenv(config.RAY_REPORT_MIN_INTERVAL_ENV, "0")
    assert config.ray_report_min_interval_from_env() == 0.0
    monkeypatch.delenv(config.RAY_REPORT_MIN_INTERVAL_ENV)
    assert config.ray_report_min_interval_from_env() == config.DEFAULT_RAY_REPORT_MIN_INTERVAL_S
    monkeypatch.setenv(config.INJECT_FAILURE_ENV, "7")
    assert config.inject_failure_from_env() == 7


@pytest.mark.parametrize("raw", ["abc", "1.5", "0"])
def test_a_bad_injected_failure_step_is_one_sentence_not_int_s_message(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(config.INJECT_FAILURE_ENV, raw)
    with pytest.raises(
        ValueError, match=rf"^TRAINOP_INJECT_FAILURE_AT_STEP must be a step number >= 1, got '{raw}'; "
    ):
        config.inject_failure_from_env()


def test_a_worker_reading_a_bad_report_interval_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.RAY_REPORT_MIN_INTERVAL_ENV, "ten")
    spec = trainer_config.TrainerConfig.model_validate(
        {"jobName": "j", "runName": "j", "storagePath": "/s", "attempt": 1, "spec": _spec()}, by_alias=True
    ).spec
    with pytest.raises(
        ValueError, match=r"^TRAINOP_RAY_REPORT_MIN_INTERVAL_S must be a number of seconds >= 0"
    ):
        step_schedule.ray_report_interval(spec)
    monkeypatch.setenv(config.RAY_REPORT_MIN_INTERVAL_ENV, "0.02")
    assert step_schedule.ray_report_interval(spec) == spec.reporting.every_seconds


def test_the_driver_forwards_the_report_interval_to_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = trainer_config.TrainerConfig.model_validate(
        {"jobName": "j", "runName": "j", "storagePath": "/s", "attempt": 1, "spec": _spec()}, by_alias=True
    )
    monkeypatch.setenv("TRAINOP_RAY_REPORT_MIN_INTERVAL_S", "0.5")
    assert ray_train.worker_env(cfg)["TRAINOP_RAY_REPORT_MIN_INTERVAL_S"] == "0.5"
    monkeypatch.delenv("TRAINOP_RAY_REPORT_MIN_INTERVAL_S")
    assert "TRAINOP_RAY_REPORT_MIN_INTERVAL_S" not in ray_train.worker_env(cfg)


def _spec() -> dict[str, object]:
    return {
        "workload": {"model": "mlp", "dataset": {"kind": "synthetic"}},
        "workers": {"replicas": 1, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "hyperparameters": {"maxSteps": 10, "batchSizePerWorker": 4, "learningRate": 0.1},
        "network": {"profile": "tcp"},
    }
