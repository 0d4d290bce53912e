"""The ``fedgp`` command line: fit and predict on CSV files, the demo, the paper reproductions.

Every command writes into ``--out``, by default a new folder under the current directory named
after the command and the time (``fedgp-fit-20261126-154501/``), never ``results/``. Every command
that writes (``fit``, ``predict``, ``demo``, ``reproduce``) first claims ``--out`` with an exclusive
create of a marker file (``.fedgp-writing``, holding the host and process id, removed when it is
done): a second command given the same ``--out`` meanwhile is refused in one line naming the folder
and the first one's pid, and a marker left by a killed run is named as such (``fit``/``predict``'s
``--force`` takes it over). ``fit`` and ``predict`` then refuse an ``--out`` that already holds a
file they would write (unless ``--force``) and write each file atomically; ``demo`` and
``reproduce`` refresh their own files in place (``--out results`` updates the committed tables).
A mistake in the input (a missing column, a cell that
is not a number, an unknown owner, ...), and any other error fedgp raises, is printed as one line
naming the file, column, line or owner, with exit status 2; running out of memory is one line too,
naming the address-space limit, with exit status 3; progress goes to stderr (a bar on a
terminal, a line every tenth of the rounds otherwise) and ``--quiet`` turns it off.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from fedgp._cli_flower import add_flower
from fedgp._cli_memory import OUT_OF_MEMORY, libraries_under_limit, memory_advice, out_of_memory
from fedgp._cli_training import (
    add_model_options,
    add_training_options,
    add_warm_start_option,
    not_converged,
    personal_setting,
)
from fedgp.errors import CommandError, ConvergenceWarning, FedGPError
from fedgp.layout import COLUMNS_FILE, HISTORY_FILE, MODEL_FILE, TRANSFORMS_FILE
from fedgp.version import __version__

if TYPE_CHECKING:
    pass

#: What ``fedgp fit`` writes into ``--out`` and ``fedgp predict`` into its ``--out``: checked before any
#: work, and never overwritten without ``--force``.
FIT_FILES = (MODEL_FILE, HISTORY_FILE, TRANSFORMS_FILE, "metrics.csv", "failures.csv", COLUMNS_FILE)
PREDICT_FILES = ("predictions.csv",)

__all__ = [
    "main",
    "build_parser",
    "default_out",
    "CommandError",
    "MODEL_FILE",
    "COLUMNS_FILE",
]

#: The exit status of a command whose input was refused (argparse uses it for usage errors too).
INPUT_ERROR = 2


def default_out(command: str, now: datetime.datetime | None = None) -> Path:
    """A new folder under the current directory named after ``command`` and the time, e.g.
    ``fedgp-fit-20261126-154501``: never ``results/``, whose committed tables a run would overwrite."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path.cwd() / f"fedgp-{command}-{stamp}"
    path, n = base, 1
    while path.exists():  # two runs in the same second get their own folders
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _out(args: argparse.Namespace) -> Path:
    return Path(args.out) if args.out is not None else default_out(args.command)


def _progress(args: argparse.Namespace) -> bool:
    """``--quiet``: nothing; else a bar on a terminal and a line every few rounds without one."""
    return not args.quiet


def _demo(args: argparse.Namespace) -> int:
    from fedgp.commands import claim_out
    from fedgp.experiments.demo import run_demo
    from fedgp.experiments.settings import quick_mode

    rounds = args.rounds if args.rounds is not None else (10 if args.quick or quick_mode() else None)
    # claimed for its writers only: a demo's or reproduction's files are meant to be refreshed in place
    with claim_out(_out(args), (), force=False) as out:
        run_demo(out, rounds=rounds, progress=_progress(args))
    return 0


def _fit(args: argparse.Namespace) -> int:
    from fedgp.commands import claim_out

    with claim_out(_out(args), FIT_FILES, args.force) as out:  # held until the files are written
        return _fit_into(out, args)


def _fit_into(out: Path, args: argparse.Namespace) -> int:
    from fedgp.commands import fit_metrics, read_tables, warm_start
    from fedgp.layout import write_model_folder
    from fedgp.presets import make_spec, make_strategy
    from fedgp.run import Progress, fit
    from fedgp.transforms import Transforms

    table = read_tables(args.data, group=args.group, target=args.target, features=args.features)
    federation = table.federation(args.test_fraction, args.seed)
    group, target, features = table.group, table.target, table.features
    del table  # the table as read, its rows now copied into the clients: freed before training
    try:
        strategy = make_strategy(
            args.strategy,
            num_clusters=args.clusters,
            personal=personal_setting(args),
            local_steps=args.local_steps,
            batch_size=args.batch_size,
            lr=args.lr,
        )
    except ValueError as err:
        raise CommandError(str(err)) from None
    if args.warm_start is None:
        spec = make_spec(args.kernel, args.mean, d=len(features), ard=args.ard)
    else:  # the model folder's kernel and mean, from its learned hyper-parameters
        spec = warm_start(Path(args.warm_start), args, target, features, _key(args))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(
            spec,
            federation,
            strategy,
            rounds=args.rounds,
            engine=args.engine,
            seed=args.seed,
            stop=None if args.stop == "none" else args.stop,
            transforms=Transforms(hide_discrete=args.hide_discrete),
            callbacks=[Progress(_progress(args))],
        )
    for warning in caught:  # fedgp's warnings, one line each, saying what to change in this command
        if issubclass(warning.category, ConvergenceWarning):
            print(f"fedgp fit: warning: {not_converged(result, args, out)}", file=sys.stderr)
        elif issubclass(warning.category, UserWarning):
            print(f"fedgp fit: warning: {warning.message}", file=sys.stderr)
    metrics = fit_metrics(result, federation, bool(args.test_fraction), _progress(args))
    columns = dict(group=group, target=target, features=features, owners=federation.ids,
                   data=", ".join(map(str, args.data)), test_fraction=args.test_fraction,
                   seed=args.seed)  # fmt: skip
    written = write_model_folder(out, result, columns, metrics=metrics, key=_key(args))
    n_train = int(federation.sizes.sum())
    n_test = int(metrics["n_test"].sum())
    print(
        f"fedgp fit: {len(federation)} owners, {n_train} rows to train on"
        + (f", {n_test} held out" if n_test else "")
        + f"; {len(features)} features ({', '.join(features)}), target {target!r}"
    )
    how = result.history.attrs.get("stop_reason", f"{len(result.history)} rounds")
    transforms = "; ".join(f"{k} {v}" for k, v in result.transforms.items())
    print(f"{type(strategy).__name__} on the {result.engine.name} engine: {how}; transforms: {transforms}")
    with _pd().option_context("display.width", 120, "display.max_rows", 20):
        print(f"per-owner metrics ({metrics['split'].iloc[0]}, original units):")
        shown = metrics.drop(columns="split")  # to_string ignores display.max_rows: 10^6 owners, 20 lines
        print(shown.to_string(index=False, float_format="{:.4g}".format, max_rows=20, min_rows=10))
    for path in written:
        print(f"wrote {path}")
    return 0


def _pd() -> ModuleType:
    import pandas as pd

    return pd


def _predict(args: argparse.Namespace) -> int:
    from fedgp.commands import claim_out

    if not 0.0 < args.level < 1.0:
        raise CommandError(f"--level must be in (0, 1), got {args.level}")
    with claim_out(_out(args), PREDICT_FILES, args.force) as out:  # held until predictions.csv is written
        return _predict_into(out, args)


def _predict_into(out: Path, args: argparse.Namespace) -> int:
    import numpy as np

    from fedgp.commands import predict_owners, read_columns, read_new_table, read_tables
    from fedgp.data.table import CLI_ROLES
    from fedgp.layout import write_table
    from fedgp.run import load

    folder = Path(args.model)
    columns = read_columns(folder)
    group = args.group or columns["group"]
    try:
        model = load(folder / MODEL_FILE, key=_key(args))
    except ValueError as err:
        raise CommandError(str(err)) from None
    features = columns["features"]
    roles = {**CLI_ROLES, "target": "the model's target", "features": "the model's features"}
    new = read_new_table(args.new, model, columns, folder, group, roles)  # by the model's feature names
    data = None
    if args.data is not None:  # one table, or the owners' rows spread over several (rows added since)
        data = read_tables(args.data, group=group, target=columns["target"], features=features, roles=roles)
    held = {} if data is None else data.rows()
    asked = new.rows()
    missing = [o for o in asked if o not in held]
    if missing and args.unknown == "error":
        lines = ", ".join(f"{o!r} (line {int(new.lines[asked[o][0]])})" for o in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        verb = "has" if len(missing) == 1 else "have"
        where = (
            f"{verb} no rows in {', '.join(args.data)}"
            if data is not None
            else f"{verb} no data: no --data was given"
        )
        raise CommandError(
            f"{args.new}: {'owner' if len(missing) == 1 else 'owners'} {lines}{more} {where}. "
            "A saved model holds no owner's data, so a "
            "personalised prediction conditions on the owner's own rows: pass the owners' training "
            "table with --data, or --unknown prior to predict for such owners from the shared prior "
            f"alone. The model was trained on owners {', '.join(map(repr, model.roster.ids[:10]))}"
            + (", ..." if len(model.roster.ids) > 10 else "")
        )
    n = len(new.X)
    mean, var_y, var_f = predict_owners(model, new, data, asked, progress=_progress(args), quiet=args.quiet)
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + args.level / 2))
    sd = np.sqrt(var_y)
    pct = f"{100 * args.level:g}"
    frame = new.frame.assign(
        mean=mean,
        sd=sd,
        **{f"lower{pct}": mean - z * sd, f"upper{pct}": mean + z * sd},
        sd_f=np.sqrt(var_f),
        conditioned_on=[len(held[o]) if o in held else 0 for o in new.owners],
    )
    out.mkdir(parents=True, exist_ok=True)
    path = write_table(frame, out / "predictions.csv")
    print(
        f"fedgp predict: {n} row(s) of {len(asked)} owner(s), {len(missing)} of them from the shared "
        "prior alone"
    )
    print(f"wrote {path}")
    return 0


#: ``fedgp reproduce`` options for held-out settings: flag -> the keyword of the experiment's
#: ``reproduce`` function that takes it (an experiment without that keyword refuses the flag).
SETTING_OPTIONS = {
    "--subset": "subset",
    "--sensors": "sensors",
    "--outputs": "outputs",
    "--partition-seed": "partition_seed",
    "--function": "function",
    "--reuse": "reuse",
    "--methods": "methods",
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
    from fedgp.commands import claim_out
    from fedgp.experiments.registry import get_reproduction, quick_runtime
    from fedgp.experiments.settings import quick_mode

    reproduce = get_reproduction(args.name)
    options = _setting_options(args.name, reproduce, args)
    quick = args.quick or quick_mode()
    if not args.quiet:  # some experiments have no progress of their own: say what to expect
        expect = quick_runtime(args.name) if quick else "the full protocol (results/README.md gives its time)"
        print(f"fedgp reproduce {args.name}: started; {expect}", file=sys.stderr, flush=True)
    try:
        with claim_out(_out(args), (), force=False) as out:
            written = reproduce(
                repeats=args.repeats,
                out_dir=out,
                seed=args.seed,
                quick=quick,
                progress=_progress(args),
                **options,
            )
    except FileNotFoundError as err:  # data files, or verdicts' input CSVs: the message names them
        raise CommandError(str(err)) from None
    for path in written:
        print(f"wrote {path}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from fedgp.datasets.registry import default_registry, locate
    from fedgp.errors import DataFileError

    registry = default_registry()
    if args.dataset not in registry.datasets():
        print(f"fedgp download: unknown dataset {args.dataset!r}; one of {', '.join(registry.datasets())}")
        return 2
    names = args.files or registry.files(args.dataset)
    try:
        for name in names:
            path = locate(
                args.dataset, name, args.root, download=True, registry=registry,
                progress=False if args.quiet else None, timeout=args.timeout,
            )  # fmt: skip
            print(f"verified {path}")
    except (DataFileError, KeyError) as err:
        print(f"fedgp download: {err}", file=sys.stderr)
        return 1
    return 0


OUT_HELP = "output folder (default: a new folder fedgp-{command}-YYYYmmdd-HHMMSS under the current directory)"


def _quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quiet",
        "--no-progress",
        dest="quiet",
        action="store_true",
        help="no progress output (default: a bar on a terminal, a line every few rounds on stderr "
        "when it is not a terminal, e.g. in a log file)",
    )


def _key_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--key-file",
        type=Path,
        default=None,
        help=f"{what} with HMAC-SHA256 under the key in this file (its bytes, a final newline removed): "
        "for models that travel; without it a model is sealed by a checksum, which detects damage, "
        "not forgery",
    )


def _key(args: argparse.Namespace) -> bytes | None:
    """The key of ``--key-file``, or ``None``."""
    if args.key_file is None:
        return None
    try:
        key = args.key_file.read_bytes()
    except OSError as err:
        raise CommandError(f"--key-file {args.key_file}: cannot be read ({err.strerror})") from None
    key = key[:-1] if key.endswith(b"\n") else key
    if not key:
        raise CommandError(f"--key-file {args.key_file}: the file is empty")
    return key


def _force_option(parser: argparse.ArgumentParser, files: tuple[str, ...]) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"overwrite {', '.join(files)} where --out holds them, each replaced atomically, and take over "
        "the marker of a killed fedgp run there (default: refuse, before any work; a --out that another "
        "running fedgp fit/predict holds is refused even with --force)",
    )


def _add_fit(sub) -> None:
    fit = sub.add_parser(
        "fit",
        help="train on a CSV table whose owner column says which client holds each row",
        description="Train a federated GP on DATA.csv, one client per owner (the --group column), with "
        "fedgp.fit and its default transforms (the target standardised and the features scaled to the "
        "unit cube, from federated sums: predictions come back in the data's units). Writes into --out: "
        f"{MODEL_FILE} (fedgp.load reads it; no owner's data is in it), {COLUMNS_FILE} (the columns, for "
        "fedgp predict), history.csv (one row per round; the hyper-parameters in the data's units, "
        "lengthscales named by feature, a column left in the model's units says so in its name), "
        f"{TRANSFORMS_FILE} (the transforms' numbers and each history column's units) and metrics.csv "
        "(per owner: RMSE, NLL, 95% coverage on the held-out rows with --test-fraction; without it, "
        "in-sample on the training rows, which is optimistic, and the table's split column says so) "
        "and failures.csv (each client failure of the run: round, owner, reason). "
        "By default the run stops when training has converged (--stop auto), within --rounds.",
    )
    fit.add_argument(
        "data",
        metavar="DATA.csv",
        nargs="+",
        help="the table: features, target and owner columns; several tables are read as one (an "
        "owner's rows added since in another file)",
    )
    fit.add_argument("--target", required=True, help="the column to predict")
    fit.add_argument("--group", required=True, help="the owner column: rows with one label are one client")
    fit.add_argument("--features", nargs="+", default=None, help="input columns (default: all the others)")
    add_model_options(fit)
    add_training_options(fit)
    fit.add_argument(
        "--test-fraction",
        type=float,
        default=None,
        help="hold out this share of each owner's rows for metrics",
    )
    add_warm_start_option(fit)
    fit.add_argument("--out", default=None, help=OUT_HELP.format(command="fit"))
    _force_option(fit, FIT_FILES)
    _key_option(fit, f"seal {MODEL_FILE}")
    _quiet_option(fit)
    fit.set_defaults(func=_fit)


def _add_predict(sub) -> None:
    pred = sub.add_parser(
        "predict",
        help="predict each row of a CSV table with its owner's posterior",
        description="Predict NEW.csv's rows with the model fedgp fit wrote to MODEL: each row from its "
        "owner's posterior, the shared prior conditioned on that owner's own rows. The saved model holds "
        "no owner's data (by design), so the owners' rows come from --data (the training table, which "
        "the owners hold); an owner of NEW.csv with no rows there is an error, or with --unknown prior "
        "is predicted from the shared prior alone. An owner with rows in --data that the model was not "
        "trained on is a new owner, conditioned on its rows. Writes predictions.csv: NEW.csv's columns "
        "plus mean, sd (of a new observation), the central --level interval (lower95, upper95), sd_f "
        "(of the latent function) and conditioned_on (the owner's rows used).",
    )
    pred.add_argument("model", metavar="MODEL", help="the folder fedgp fit wrote (its --out)")
    pred.add_argument("new", metavar="NEW.csv", help="rows to predict: the feature and owner columns")
    pred.add_argument(
        "--group", default=None, help="the owner column (default: the one the model was fitted with)"
    )
    pred.add_argument(
        "--data",
        default=None,
        action="append",
        metavar="DATA.csv",
        help="the owners' rows to condition on; repeat it for rows in several tables (the training "
        "table and the rows an owner added since: each owner is conditioned on all its rows, with the "
        "model's hyper-parameters and transforms, as FitResult.update does)",
    )
    pred.add_argument(
        "--unknown",
        default="error",
        choices=["error", "prior"],
        help="an owner without rows: error (default) or prior",
    )
    pred.add_argument("--level", type=float, default=0.95, help="interval probability (default 0.95)")
    pred.add_argument("--out", default=None, help=OUT_HELP.format(command="predict"))
    _force_option(pred, PREDICT_FILES)
    _key_option(pred, f"check {MODEL_FILE}")
    _quiet_option(pred)
    pred.set_defaults(func=_predict)


def _add_demo(sub) -> None:
    from fedgp.experiments.registry import quick_runtime

    demo = sub.add_parser("demo", help="personalisation demo and a small FGPR study (table + PNG)")
    demo.add_argument("--out", default=None, help=OUT_HELP.format(command="demo"))
    demo.add_argument("--rounds", type=int, default=None, help="rounds for both parts (default 60 / 100)")
    demo.add_argument(
        "--quick", action="store_true", help=f"10 rounds (also: FEDGP_QUICK=1); {quick_runtime('demo')}"
    )
    _quiet_option(demo)
    demo.set_defaults(func=_demo)


def _add_reproduce(sub) -> None:
    from fedgp.experiments.registry import DESCRIPTIONS, REPRODUCTIONS, quick_runtime

    listing = "\n".join(
        f"  {name:<17} {DESCRIPTIONS[name]}\n  {'':<17} {quick_runtime(name)}" for name in REPRODUCTIONS
    )
    rep = sub.add_parser(
        "reproduce",
        help="reproduce a paper table: writes CSV and markdown",
        description="Run one of the paper reproductions and write its CSV and markdown into --out. "
        "The full protocols take from minutes to hours (results/README.md gives each command and its "
        "time); --quick runs a few repeats and rounds, and its time on this project's machine is "
        "listed below. Progress goes to stderr (--quiet: none).",
        epilog=f"experiments (--quick measured by benchmarks/cli_quick_times.py):\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("name", help=f"one of: {', '.join(REPRODUCTIONS)}")
    rep.add_argument("--repeats", type=int, default=None, help="repetitions (default: the paper's)")
    rep.add_argument(
        "--out",
        default=None,
        help=OUT_HELP.format(command="reproduce")
        + "; --out results updates the committed tables of a repository checkout",
    )
    rep.add_argument("--seed", type=int, default=0, help="master seed")
    rep.add_argument("--quick", action="store_true", help="a few repeats and rounds (also FEDGP_QUICK=1)")
    _quiet_option(rep)
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
        "your own fedgp.synthetic.multifidelity.MultiFidelityFunction",
    )
    held.add_argument(
        "--reuse",
        default=None,
        metavar="DIR",
        help="table1: keep the per-repeat rows already in DIR's table1_runs.csv / table1_sweep_runs.csv "
        "(same protocol) and run only the methods they lack",
    )
    held.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="table1: only these methods (e.g. FGPR AR1 MF-DGP; default all of Table 1's); "
        "the HF-size sweep runs those of its methods named, and is skipped if none is",
    )
    rep.set_defaults(func=_reproduce)


def _add_download(sub) -> None:
    dl = sub.add_parser(
        "download", help="fetch and verify a dataset's files (see fedgp/datasets/registry.json)"
    )
    dl.add_argument("dataset", help="a dataset of the registry, e.g. cmapss or sarcos")
    dl.add_argument("files", nargs="*", help="file names (default: all of the dataset's files)")
    dl.add_argument("--root", default=None, help="data root (default: FEDGP_DATA, else datasets/)")
    dl.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the server (default 60)")
    _quiet_option(dl)
    dl.set_defaults(func=_download)


def build_parser() -> argparse.ArgumentParser:
    """The ``fedgp`` argument parser: fit, predict, demo, reproduce, download, flower."""
    parser = argparse.ArgumentParser(prog="fedgp", description="Federated Gaussian-process regression.")
    parser.add_argument("--version", action="version", version=f"fedgp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_fit, _add_predict, _add_demo, _add_reproduce, _add_download, add_flower):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fedgp`` with ``argv`` (default: the command line); returns the exit status, 2 for
    refused input (printed as one line on stderr)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["flower", "supernode"]:  # flower-supernode's own options pass through as they are
        argv = ["flower", "supernode", "--", *argv[2:]]
    refused = libraries_under_limit(argv[0] if argv else "")  # before the parser imports them
    if refused:
        print(f"fedgp {argv[0]}: {refused}", file=sys.stderr)
        return OUT_OF_MEMORY
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FedGPError as err:  # fedgp's own errors: what was refused, and where, on one line
        print(f"fedgp {args.command}: {_one_line(err)}", file=sys.stderr)
        return INPUT_ERROR
    except OSError as err:  # a folder or file the command cannot write (permissions, a full disk...)
        print(f"fedgp {args.command}: {_one_line(err)}", file=sys.stderr)
        return INPUT_ERROR
    except (MemoryError, RuntimeError) as err:  # Python's, or torch's std::bad_alloc, as one line
        if not out_of_memory(err):
            raise
        print(f"fedgp {args.command}: {memory_advice(err)}", file=sys.stderr)
        return OUT_OF_MEMORY


def _one_line(err: BaseException) -> str:
    """``err``'s message on one line (a line break becomes "; ")."""
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
