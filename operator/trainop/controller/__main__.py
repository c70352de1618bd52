"""``python -m trainop.controller``: the operator process (what ``trainop operator`` runs, and the tests).

This module must not do anything but parse arguments and call ``main.run``.
"""

from __future__ import annotations

import argparse
import os

from trainop.controller import main, options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainop.controller", description="Run the trainop operator."
    )
    options.add_arguments(parser, default_log_format=os.environ.get("TRAINOP_LOG_FORMAT", "full"))
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> int:
    return main.run(**options.run_kwargs(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(cli())
