"""User entrypoints: a bad ``spec.workload.entrypoint`` fails before any worker starts, in one sentence."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import trainer_support

from trainop_trainer import user


@pytest.mark.parametrize(
    ("entrypoint", "fragments"),
    [
        (
            "no_such_package.train:main",
            ["module 'no_such_package.train' cannot be imported", "install the package"],
        ),
        ("json:no_such_function", ["module 'json' has no attribute 'no_such_function'", "name a function"]),
        ("json:__version__", ["json.__version__ is a str, not a callable", "point it at a function"]),
        ("json", ["must have the form 'pkg.module:function'"]),
    ],
)
def test_a_bad_entrypoint_gives_one_sentence_naming_the_field_and_the_fix(
    entrypoint: str, fragments: list[str]
) -> None:
    with pytest.raises(user.EntrypointError) as caught:
        user.resolve(entrypoint)
    message = str(caught.value)
    assert message.startswith(f"spec.workload.entrypoint {entrypoint!r}")
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_an_entrypoint_module_that_fails_to_import_names_the_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_workload.py").write_text("raise KeyError('DATA_DIR')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        user.EntrypointError, match=r"raised KeyError: 'DATA_DIR'; fix that error in your module"
    ):
        user.resolve("broken_workload:train")
    sys.modules.pop("broken_workload", None)


def test_a_good_entrypoint_resolves_to_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(trainer_support.EXAMPLES_USER))
    function = user.resolve("trainop_example.regression:train")
    assert function.__name__ == "train" and function.__module__ == "trainop_example.regression"


def test_the_entry_point_exits_2_with_one_error_line_for_a_bad_entrypoint(tmp_path: pathlib.Path) -> None:
    config = trainer_support.mlp_config(
        tmp_path,
        "bad-entry",
        workload={"entrypoint": "missing_pkg.module:train", "config": {}},
    )
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    done = subprocess.run(
        [trainer_support.PYTHON, "-m", "trainop_trainer", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=trainer_support.subprocess_env(RAY_ADDRESS="127.0.0.1:1"),  # must fail before touching Ray
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        "trainop: error: spec.workload.entrypoint 'missing_pkg.module:train': module 'missing_pkg.module' "
        "cannot be imported (No module named 'missing_pkg'); install the package that provides it in the "
        "trainer image (or put it on PYTHONPATH), or correct the module path"
    ]
