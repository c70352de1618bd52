"""The plugin's verbs as subcommands of the ``trainop`` command line (``trainop.cli`` adds them).

Each prints to stdout and returns the exit code: 0 done, 1 the cluster said no or the job is not where the
verb needs it (one sentence on stderr: what and what to do), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable

from trainop.plugin import checkpoints, lifecycle, logs, status
from trainop.plugin import kubectl as kubectl_module
from trainop.plugin import target as target_module

VERBS = ("status", "logs", "checkpoints", "suspend", "resume", "restart")
DEFAULT_TIMEOUT_S = 120.0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def verb(name: str, help: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        p.add_argument("name", metavar="NAME", help="the TrainingJob (or TuningSweep) name")
        p.add_argument(
            "--sweep", action="store_true", help="NAME is a TuningSweep (else a TrainingJob first)"
        )
        p.add_argument("--namespace", "-n", help="its namespace (default: the kubeconfig context's)")
        p.add_argument("--context", help="the kubeconfig context to use")
        p.add_argument("--kubeconfig", help="the kubeconfig file to use")
        p.set_defaults(func=func)
        return p

    verb("status", "show a job's phase, progress, newest checkpoint, network and last failures", _status)
    p = verb(
        "logs", "print the job's log (every rank's lines) from the Ray head of its current attempt", _logs
    )
    p.add_argument("--rank", type=int, metavar="N", help="only the trainer's lines of rank N")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing as the log grows")
    p.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines of the log")
    p = verb(
        "checkpoints", "list the checkpoints on the job's claim: step, epoch, time, size, loss", _checkpoints
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for a claim pod")
    verb("suspend", "suspend a job: its Ray pods go, its checkpoints stay (spec.suspend: true)", _suspend)
    verb("resume", "resume a suspended job from its newest checkpoint (spec.suspend: false)", _resume)
    p = verb(
        "restart",
        "start a new attempt of a running job from its newest checkpoint (or --from-step)",
        _restart,
    )
    p.add_argument(
        "--from-step",
        type=int,
        metavar="S",
        help="resume from the newest checkpoint at or before step S; newer ones are set aside (renamed)",
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for each step")


def _client(args: argparse.Namespace) -> kubectl_module.Kubectl:
    return kubectl_module.Kubectl(namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig)


def _guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def guarded(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (kubectl_module.KubectlError, target_module.TargetError) as error:
            print(f"kubectl trainop {args.command}: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130

    return guarded


@_guarded
def _status(args: argparse.Namespace) -> int:
    target = target_module.resolve(_client(args), args.name, sweep=args.sweep)
    print(status.screen(target, now=datetime.datetime.now(datetime.UTC)))
    return 0


@_guarded
def _logs(args: argparse.Namespace) -> int:
    client = _client(args)
    target = target_module.resolve(client, args.name, sweep=args.sweep)
    for line in logs.show(client, target, rank=args.rank, follow=args.follow, tail=args.tail):
        sys.stdout.write(line)
        if args.follow:
            sys.stdout.flush()
    return 0


@_guarded
def _checkpoints(args: argparse.Namespace) -> int:
    client = _client(args)
    target = target_module.resolve(client, args.name, sweep=args.sweep)
    if not target.kind.reports_workers:
        raise target_module.TargetError(
            "a TuningSweep's checkpoints are its trials' (kubectl trainop status shows the best trial's)"
        )
    try:
        rows, where = checkpoints.read(client, target, timeout_s=args.timeout)
    except (checkpoints.ClaimUnreadable, kubectl_module.KubectlError) as error:
        rows = checkpoints.from_status(target)
        print(
            f"the claim could not be read ({error}); the newest checkpoint the trainer reported:",
            file=sys.stderr,
        )
        where = "the status"
        if not rows:
            print(f"{target.describe()} has reported no checkpoint")
            return 1
    if not rows:
        print(f"no checkpoints of {target.describe()} yet (read by {where})")
        return 0
    print(checkpoints.table(rows))
    return 0


@_guarded
def _suspend(args: argparse.Namespace) -> int:
    target = target_module.resolve(_client(args), args.name, sweep=args.sweep)
    target, changed = lifecycle.set_suspend(_client(args), target, suspend=True)
    print(
        f"{target.describe()} suspended: the operator deletes its Ray pods; checkpoints stay"
        if changed
        else f"{target.describe()} is already suspended (phase {target.phase})"
    )
    return 0


@_guarded
def _resume(args: argparse.Namespace) -> int:
    target = target_module.resolve(_client(args), args.name, sweep=args.sweep)
    target, changed = lifecycle.set_suspend(_client(args), target, suspend=False)
    print(
        f"{target.describe()} resumed: the operator starts a new attempt from the newest checkpoint"
        if changed
        else f"{target.describe()} is not suspended (phase {target.phase})"
    )
    return 0


@_guarded
def _restart(args: argparse.Namespace) -> int:
    client = _client(args)
    target = target_module.resolve(client, args.name, sweep=args.sweep)
    done = lifecycle.restart(client, target, from_step=args.from_step, timeout_s=args.timeout, say=print)
    print(f"{done.describe()}: attempt {done.attempt}, phase {done.phase}")
    return 0
