"""The ``fedgp`` command line."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from fedgp.experiments.demo import run_demo
    from fedgp.experiments.settings import quick_mode

    rounds = args.rounds if args.rounds is not None else (10 if args.quick or quick_mode() else None)
    run_demo(args.out, rounds=rounds, progress=False if args.no_progress else None)
    return 0


#: ``fedgp reproduce`` options for held-out settings: flag -> the keyword of the experiment's
#: ``reproduce`` function that takes it (an experiment without that keyword refuses the flag).
SETTING_OPTIONS = {
    "--subset": "subset",
    "--sensors": "sensors",
    "--outputs": "outputs",
    "--partition-seed": "partition_seed",
    "--function": "function",
}


def _setting_options(name: str, reproduce, args: argparse.Namespace) -> dict:
    """The held-out-setting options given on the command line, checked against what ``name`` takes."""
    import inspect

    accepted = inspect.signature(reproduce).parameters
    given = {flag: key for flag, key in SETTING_OPTIONS.items() if getattr(args, key) is not None}
    refused = [flag for flag, key in given.items() if key not in accepted]
    if refused:
        own = [flag for flag, key in SETTING_OPTIONS.items() if key in accepted]
        raise SystemExit(
            f"fedgp reproduce {name}: {', '.join(refused)} is not an option of {name}; "
            + (f"its options are {', '.join(own)}" if own else f"{name} has no setting options")
        )
    return {key: getattr(args, key) for key in given.values()}


def _reproduce(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fedgp.experiments.registry import get_reproduction
    from fedgp.experiments.settings import quick_mode

    reproduce = get_reproduction(args.name)
    options = _setting_options(args.name, reproduce, args)
    written = reproduce(
        repeats=args.repeats,
        out_dir=Path(args.out),
        seed=args.seed,
        quick=args.quick or quick_mode(),
        progress=False if args.no_progress else None,
        **options,
    )
    for path in written:
        print(f"wrote {path}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from fedgp.data.registry import DataFileError, default_registry, locate

    registry = default_registry()
    if args.dataset not in registry.datasets():
        print(f"fedgp download: unknown dataset {args.dataset!r}; one of {', '.join(registry.datasets())}")
        return 2
    names = args.files or registry.files(args.dataset)
    try:
        for name in names:
            path = locate(
                args.dataset, name, args.root, download=True, registry=registry,
                progress=False if args.no_progress else None, timeout=args.timeout,
            )  # fmt: skip
            print(f"verified {path}")
    except (DataFileError, KeyError) as err:
        print(f"fedgp download: {err}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedgp", description="Federated Gaussian-process regression.")
    parser.add_argument("--version", action="version", version=f"fedgp {__import__('fedgp').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="personalisation demo and a small FGPR study (table + PNG)")
    demo.add_argument("--out", default="results/demo", help="folder for demo.png and CSVs")
    demo.add_argument("--rounds", type=int, default=None, help="rounds for both parts (default 60 / 100)")
    demo.add_argument("--quick", action="store_true", help="10 rounds (also: FEDGP_QUICK=1)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=_demo)
    from fedgp.experiments.registry import REPRODUCTIONS

    rep = sub.add_parser("reproduce", help="reproduce a paper table: writes CSV and markdown")
    rep.add_argument("name", help=f"one of: {', '.join(sorted(REPRODUCTIONS)) or 'none yet'}")
    rep.add_argument("--repeats", type=int, default=None, help="repetitions (default: the paper's)")
    rep.add_argument("--out", default="results", help="folder for the CSV and markdown files")
    rep.add_argument("--seed", type=int, default=0, help="master seed")
    rep.add_argument("--quick", action="store_true", help="a few repeats and rounds (also FEDGP_QUICK=1)")
    rep.add_argument("--no-progress", action="store_true", help="no progress bars")
    held = rep.add_argument_group(
        "held-out settings (the paper's when left out; results get their own file names)"
    )
    held.add_argument("--subset", default=None, help="table2: C-MAPSS subset, e.g. FD003 (paper: FD001)")
    held.add_argument("--sensors", nargs="+", default=None, help="table2: sensors, e.g. s3 s4 (paper: s2 s7)")
    held.add_argument(
        "--outputs", nargs="+", type=int, default=None, help="table3: SARCOS outputs 1-7, e.g. 2 4"
    )
    held.add_argument(
        "--partition-seed",
        type=int,
        default=None,
        help="table3: seed of the device partitions, apart from --seed (default: derived from --seed)",
    )
    held.add_argument(
        "--function",
        nargs="+",
        default=None,
        help="table1: multi-fidelity functions by name (e.g. forrester) or as module:attribute of "
        "your own fedgp.data.multifidelity.MultiFidelityFunction",
    )
    rep.set_defaults(func=_reproduce)

    dl = sub.add_parser("download", help="fetch and verify a dataset's files (see datasets/registry.json)")
    dl.add_argument("dataset", help="a dataset of the registry, e.g. cmapss or sarcos")
    dl.add_argument("files", nargs="*", help="file names (default: all of the dataset's files)")
    dl.add_argument("--root", default=None, help="data root (default: FEDGP_DATA, else datasets/)")
    dl.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the server (default 60)")
    dl.add_argument("--no-progress", action="store_true", help="no progress bars")
    dl.set_defaults(func=_download)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``fedgp`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
