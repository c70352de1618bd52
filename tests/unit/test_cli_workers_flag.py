"""`trainop run --workers` takes a worker count of at least 1, refused by the parser otherwise."""

from __future__ import annotations

import pytest

from trainop import cli


@pytest.mark.parametrize("value", ["0", "-2"])
def test_run_refuses_fewer_than_one_worker(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.build_parser().parse_args(["run", "x.yaml", "--workers", value])
    assert raised.value.code == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_run_takes_one_worker_or_more() -> None:
    assert cli.build_parser().parse_args(["run", "x.yaml", "--workers", "1"]).workers == 1
