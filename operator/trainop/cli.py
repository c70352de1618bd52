"""The one ``trainop`` command.

    trainop crds [--out DIR]       print (or write) the CRDs generated from the models (and the docs and the
                                   chart's RBAC template: --docs FILE, --chart-rbac FILE)
    trainop validate FILE...       validate manifests with the same models; field-level messages
    trainop render FILE            print the objects the operator would create for a manifest (offline)
    trainop run FILE               local mode: run a TrainingJob/TuningSweep on a local Ray runtime
    trainop operator               start the kopf operator
    trainop status|logs|checkpoints|suspend|resume|restart NAME
                                   day-2 verbs against a cluster (``trainop.plugin``), also as the kubectl
                                   plugin ``kubectl trainop ...`` (the same program installed as
                                   ``kubectl-trainop``)

Heavy imports (kopf, ray, torch) happen inside the subcommand that needs them, so ``trainop validate``
stays instant and works with only the base install.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import textwrap
from collections.abc import Sequence

from trainop.api import crd, manifest, reference
from trainop.controller import options, rbac
from trainop.plugin import commands as plugin_commands

# Installed twice ([project.scripts]): as `trainop` and as `kubectl-trainop`, which kubectl runs for
# `kubectl trainop ...`.
KUBECTL_PLUGIN = "kubectl-trainop"


def _cmd_crds(args: argparse.Namespace) -> int:
    crds = crd.all_crds()
    if not args.out and (args.docs or args.chart_rbac):
        flag = "--docs" if args.docs else "--chart-rbac"
        print(f"trainop crds: {flag} writes beside the CRD files: add --out DIR", file=sys.stderr)
        return 2
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for filename, obj in crds.items():
            (out / filename).write_text(crd.render_yaml(obj))
            print(f"wrote {out / filename}")
        if args.docs:
            pathlib.Path(args.docs).write_text(reference.render())
            print(f"wrote {args.docs}")
        if args.chart_rbac:
            pathlib.Path(args.chart_rbac).write_text(rbac.chart_template())
            print(f"wrote {args.chart_rbac}")
        return 0
    print("\n---\n".join(crd.render_yaml(obj) for obj in crds.values()), end="")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            resources = manifest.load_file(path)
        except manifest.ManifestError as exc:
            failed += 1
            for error in exc.errors:
                print(f"{path}: {error}", file=sys.stderr)
                if error.explanation:
                    # The field's own description (the CRD's, `kubectl explain`'s): what it is for.
                    field = error.explained_field.removeprefix("spec.")
                    print(
                        textwrap.fill(
                            f"{field}: {error.explanation}",
                            width=100,
                            initial_indent="    ",
                            subsequent_indent="    ",
                        ),
                        file=sys.stderr,
                    )
            continue
        for resource in resources:
            print(f"{path}: {resource.kind}/{resource.metadata.name} is valid")
    return 1 if failed else 0


def _cmd_render(args: argparse.Namespace) -> int:
    from trainop import render  # the operator's pure builders: no API access

    try:
        resources = manifest.load_file(args.file)
    except manifest.ManifestError as exc:
        for error in exc.errors:
            print(f"{args.file}: {error}", file=sys.stderr)
        return 2
    print(render.render_text(resources, namespace=args.namespace, uid=args.uid), end="")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        resources = manifest.load_file(args.file)
    except manifest.ManifestError as exc:
        for error in exc.errors:
            print(f"{args.file}: {error}", file=sys.stderr)
        return 2
    if len(resources) != 1:
        print(
            f"{args.file}: holds {len(resources)} manifests; `trainop run` takes exactly one", file=sys.stderr
        )
        return 2
    run_options = {
        "workers": args.workers,
        "inject_failure_at_step": args.inject_failure_at_step,
        "state_dir": args.state_dir,
        "fresh": args.fresh,
        "verbose": args.verbose,
    }
    if resources[0].kind == "TuningSweep":
        from trainop_trainer.sweep import local as sweep_local  # heavy: ray, torch

        return sweep_local.run_sweep_manifest(args.file, **run_options)

    from trainop_trainer import local  # heavy: ray, torch

    return local.run_manifest(args.file, **run_options)


def _cmd_operator(args: argparse.Namespace) -> int:
    from trainop.controller import main as controller_main  # heavy: kopf, kubernetes

    return controller_main.run(**options.run_kwargs(args))


def _workers(text: str) -> int:
    """``--workers``: a whole number of at least 1 (argparse reports the message as the usage error)."""
    try:
        workers = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers must be a whole number, not {text!r}") from None
    if workers < 1:
        raise argparse.ArgumentTypeError("--workers must be >= 1")
    return workers


def build_parser(prog: str = "trainop") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Distributed PyTorch training on Ray, as Kubernetes resources."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("crds", help="print the CustomResourceDefinitions generated from the API models")
    p.add_argument("--out", metavar="DIR", help="write one YAML file per CRD into DIR instead of printing")
    p.add_argument(
        "--docs", metavar="FILE", help="with --out: also write the API reference (Markdown) to FILE"
    )
    p.add_argument(
        "--chart-rbac",
        metavar="FILE",
        help="with --out: also write the chart's RBAC template (charts/trainop/templates/_rbac.tpl) to FILE",
    )
    p.set_defaults(func=_cmd_crds)

    p = sub.add_parser("validate", help="validate TrainingJob/TuningSweep manifests")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser(
        "render",
        help="print the objects the operator would create for a manifest (attempt 1), without a cluster",
        description="Print, as YAML, the objects the operator creates for each TrainingJob/TuningSweep "
        "in FILE when it starts attempt 1: the checkpoint claim, the trainer ConfigMap, the RBAC "
        "objects and the RayJob with its pod templates, built by the operator's own code. A comment "
        "sums up the pods and their requests.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--namespace",
        "-n",
        default=None,
        help="namespace for a manifest that names none (default: default)",
    )
    p.add_argument(
        "--uid",
        default=None,
        help="the owner's uid for owner references (the apiserver assigns it; default: all zeros)",
    )
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser("run", help="run a manifest locally on Ray (no cluster needed)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--workers", type=_workers, default=None, help="override spec.workers.replicas (>= 1)")
    p.add_argument(
        "--inject-failure-at-step",
        type=int,
        default=None,
        metavar="STEP",
        help="kill one worker once, at STEP if a checkpoint exists by then (else right after the next "
        "checkpoint), to show recovery from the newest checkpoint",
    )
    p.add_argument(
        "--state-dir", default=".trainop", help="where checkpoints and status go (default .trainop)"
    )
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming earlier checkpoints")
    p.add_argument("--verbose", action="store_true", help="show Ray's and every worker's logs")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("operator", help="start the operator (kopf)")
    options.add_arguments(p, default_log_format="plain")
    p.set_defaults(func=_cmd_operator)

    plugin_commands.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    invoked_as = os.path.basename(sys.argv[0]) if sys.argv else ""
    prog = "kubectl trainop" if invoked_as == KUBECTL_PLUGIN else "trainop"
    args = build_parser(prog).parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
