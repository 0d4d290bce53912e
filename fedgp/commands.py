"""What ``fedgp fit`` and ``fedgp predict`` do besides parsing their arguments: claim the output
folder (never overwriting a file without ``--force``; the files are written atomically by
:mod:`fedgp.layout`), read a model
folder's column description, and compute the per-owner metrics and predictions with progress.

The in-sample metrics of ``fedgp fit`` (no ``--test-fraction``) are every owner's posterior at its own
training rows. On the batched engine they are computed as the held-out metrics are, by the engine for
many owners at once (each owner's training rows as its test split), so that a million owners take
minutes, not hours; on another engine, owner by owner.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedgp import files
from fedgp.errors import CommandError, InputError
from fedgp.layout import COLUMNS_FILE, MODEL_FILE, owner_metrics, read_columns
from fedgp.run.progress import progress_bar

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "claim_out",
    "WRITER_MARKER",
    "read_columns",
    "read_new_table",
    "fit_metrics",
    "predict_owners",
    "OWNERS_PER_STEP",
]

#: Owners evaluated per step of the batched in-sample metrics (one progress step each).
OWNERS_PER_STEP = 20_000


#: The marker a writer creates, exclusively, in its ``--out`` before writing anything there, and
#: removes when it is done: a second writer finds it and refuses (see :func:`claim_out`).
WRITER_MARKER = ".fedgp-writing"


def _marker_text() -> str:
    return json.dumps({"host": files._HOST, "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})


def _read_marker(path: Path) -> dict:
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return held if isinstance(held, dict) else {}


def _who(held: dict) -> str:
    pid = held.get("pid")
    since = held.get("since")
    return ", ".join(
        part for part in (f"pid {pid}" if pid is not None else "", f"since {since}" if since else "") if part
    )


def _take_over(marker: Path) -> None:
    """Move a dead writer's marker aside (an atomic rename: of two processes taking it over, one
    moves it and the other finds it gone) and remove it."""
    aside = marker.with_name(f"{marker.name}.stale-{secrets.token_hex(6)}")
    try:
        os.rename(marker, aside)
    except FileNotFoundError:
        return
    aside.unlink(missing_ok=True)


@contextlib.contextmanager
def claim_out(out: Path, names: Sequence[str], force: bool) -> Iterator[Path]:
    """Claim ``out`` for this process before any work, and hold it while the block runs.

    The claim is an exclusive create (``O_CREAT | O_EXCL``) of :data:`WRITER_MARKER` in ``out``
    (made if new), holding this host and process id: of several commands given the same ``--out``
    at once, exactly one creates it; the others raise :class:`CommandError` naming the folder and
    the writer that holds it. A marker whose writer is no longer running (killed, or its machine
    restarted) is named as such; ``force`` takes it over. Once claimed, none of the files ``names``
    may exist unless ``force`` (each is then replaced atomically, file by file). The marker is
    removed when the block ends, and so is ``out`` if this call made it and it is left empty."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out} is a file, not a folder: give a folder (new or existing)")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(out)
        created = True
    except FileExistsError:
        created = False
        if not out.is_dir():
            raise CommandError(
                f"--out {out} is a file, not a folder: give a folder (new or existing)"
            ) from None
    marker = out / WRITER_MARKER
    try:
        for _ in range(10):
            try:
                fd = os.open(marker, files._CREATE, 0o644)
            except FileExistsError:
                held = _read_marker(marker)
                who = _who(held)
                if files._writer_is_dead(
                    held.get("host"), None if held.get("pid") is None else str(held["pid"])
                ):
                    if force:
                        _take_over(marker)
                        continue
                    raise CommandError(
                        f"--out {out} holds {WRITER_MARKER} from a fedgp writer that is no longer running "
                        f"({who or 'unknown pid'}; killed or crashed), so its files may be incomplete: pass "
                        f"--force to replace them, or remove {marker} and the folder's files"
                    ) from None
                raise CommandError(
                    f"--out {out} is being written by another fedgp process ({who or 'pid unknown'}; its "
                    f"marker {marker}): wait for it to finish or choose another --out (if no fedgp "
                    "process writes there, remove the marker)"
                ) from None
            with os.fdopen(fd, "w") as handle:
                handle.write(_marker_text() + "\n")
            break
        else:  # pragma: no cover - ten takeovers in a row
            raise CommandError(f"--out {out}: could not claim it ({marker} keeps coming back)")
    except BaseException:
        if created:
            _remove_if_empty(out)
        raise
    try:
        there = [name for name in names if (out / name).exists() or (out / name).is_symlink()]
        if there and not force:
            raise CommandError(
                f"--out {out} already holds {', '.join(there)}, which this command would overwrite; choose "
                "another --out, remove them, or pass --force to overwrite them"
            )
        yield out
    finally:
        marker.unlink(missing_ok=True)
        if created:
            _remove_if_empty(out)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty (or gone): leave it
        pass


def read_new_table(
    path: str | Path, model: Any, columns: dict, folder: Path, group: str, roles: dict | None = None
) -> Any:
    """The table ``fedgp predict`` predicts (an :class:`~fedgp.data.table.OwnerTable`), its feature
    columns read by name in the model's order (any order in the file). A model folder whose
    ``model.fedgp`` names other features than its ``columns.json`` (files of two folders mixed) is
    refused; columns that are not features are named on stderr (the model does not read them, and a
    user who thinks it does would otherwise never learn it). ``roles``: how the door names the
    columns' roles in messages (:func:`~fedgp.data.table.read_owner_table`)."""
    from fedgp.data.table import read_owner_table

    features = list(columns["features"])
    if model.feature_names is not None and list(model.feature_names) != features:
        raise CommandError(
            f"{folder}: {MODEL_FILE} was trained on features {list(model.feature_names)} but {COLUMNS_FILE} "
            f"lists {features}: the folder's files do not belong together (copy the whole folder that "
            "fedgp fit wrote)"
        )
    table = read_owner_table(path, group=group, features=features, roles=roles)
    unused = [c for c in table.frame.columns if c not in {*features, group, columns["target"]}]
    if unused:
        print(
            f"fedgp predict: warning: {table.source}: column(s) {', '.join(map(repr, unused[:10]))}"
            f"{', ...' if len(unused) > 10 else ''} are not features of the model and do not affect the "
            f"predictions (its features: {', '.join(features)}); they are copied to predictions.csv",
            file=sys.stderr,
        )
    return table


def fit_metrics(result: Any, federation: Any, held_out: bool, progress: bool | None) -> pd.DataFrame:
    """``metrics.csv`` of ``fedgp fit`` (:func:`fedgp.layout.owner_metrics`'s table): held out with a
    test split; else in-sample, on the batched engine for many owners at once, otherwise owner by
    owner; ``progress`` as :func:`fedgp.run.progress.progress_bar` takes it."""
    if held_out:
        return owner_metrics(result, federation, held_out=True)
    if getattr(result.engine, "name", None) == "batched":
        return _batched_in_sample(result, federation, progress)

    def bar(clients):
        return progress_bar(clients, progress=progress, desc="in-sample metrics", total=len(federation))

    return owner_metrics(result, federation, held_out=False, progress=bar)


def _batched_in_sample(result: Any, federation: Any, progress: bool | None) -> pd.DataFrame:
    """Every owner's posterior at its training rows, by a batched engine holding each owner's
    training rows as its test split: the ``evaluate`` task of ``result.evaluate()``, in steps of
    :data:`OWNERS_PER_STEP` owners, each step on an engine of its own owners only (10⁶ owners: one
    step's copies in memory at a time, not a second federation)."""
    import pandas as pd

    from fedgp.engines import Batched
    from fedgp.messages import Roster
    from fedgp.run.exchange import ask, send_transform

    K = len(federation)
    nan = torch.full((K,), math.nan, dtype=torch.float64)
    columns = {name: nan.clone() for name in ("rmse", "nll", "coverage95")}
    failures: dict[Any, str] = {}
    bar = progress_bar(progress=progress, desc="in-sample metrics", total=K, unit="owner")
    with bar:
        for start in range(0, K, OWNERS_PER_STEP):
            known = torch.arange(start, min(start + OWNERS_PER_STEP, K))
            clients = [_in_sample(federation[p]) for p in known.tolist()]
            engine = Batched(check=False).build(result.spec, clients, 0, keys=known)
            try:
                engine.prepare(result.strategy, 0)
                sizes = torch.tensor([c.n for c in clients])
                roster = Roster(
                    [c.id for c in clients], sizes, sizes, torch.full_like(sizes, clients[0].n_features)
                )
                send_transform(engine, roster, result.transform)
                replies = ask(result, "evaluate", torch.arange(len(clients)), known=known, engine=engine)
            finally:
                engine.close()
            for name, column in columns.items():
                column[known[replies.clients]] = replies.individual[name].to(torch.float64)
            failures.update({federation[int(known[p])].id: reason for p, reason in replies.failures.items()})
            bar.update(len(known))
    frame = pd.DataFrame(
        {"owner": list(federation.ids), "n_train": federation.sizes.tolist(), "n_test": 0,
         **{name: column.numpy() for name, column in columns.items()}}
    )  # fmt: skip
    frame.attrs["failures"] = failures
    return frame.assign(split="in-sample (training rows)")


def predict_owners(
    model: Any, new: Any, data: Any | None, asked: dict, progress: bool | None, quiet: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``fedgp predict``'s posteriors: the rows ``asked[owner]`` of table ``new`` (an
    :class:`~fedgp.data.table.OwnerTable`) from each owner's posterior, conditioned on its rows in
    table ``data`` (none for an owner without any: the shared prior). Returns the mean and the
    variances of y and f per row of ``new``; a new owner is announced on stderr unless ``quiet``."""
    import numpy as np

    from fedgp.data import ClientData

    held = {} if data is None else data.rows()
    trained = set(model.roster.ids)
    n, d = len(new.X), new.X.shape[1]
    mean, var_y, var_f = np.empty(n), np.empty(n), np.empty(n)
    for owner, rows in progress_bar(asked.items(), progress=progress, desc="predict", total=len(asked)):
        if owner in held:
            client = data.client(owner, held[owner])
            if owner not in trained and not quiet:
                print(
                    f"fedgp predict: owner {owner!r} was not among the model's training owners: "
                    f"predicted as a new owner from its {client.n} row(s) in {data.source}",
                    file=sys.stderr,
                )
        else:  # no rows to condition on (a cold start)
            client = ClientData(np.empty((0, d)), np.empty(0), id=owner)
        try:
            pred = model.posterior(new.X[rows], client)
        except InputError as err:  # NEW.csv's rows the model refuses: name the file
            raise CommandError(f"{new.source}: {err}") from None
        mean[rows] = pred.mean.numpy()
        var_y[rows] = pred.variance_y.numpy()
        var_f[rows] = pred.variance_f.numpy()
    return mean, var_y, var_f


def _in_sample(client: Any) -> Any:
    """A copy of ``client`` whose test split is its training data. ``ClientData.with_test`` would check
    the same, already checked, tensors again (about half a millisecond a client: minutes for 10^6)."""
    return client.derived(X_test=client.X, y_test=client.y)


def read_tables(paths: Sequence[str], **options: Any) -> Any:
    """The owner tables at ``paths`` (:func:`~fedgp.data.table.read_owner_table` with ``options``,
    the CLI's roles by default) read as one: an owner's rows may be in several (rows added since a
    fit)."""
    from fedgp.data.table import CLI_ROLES, join_tables, read_owner_table

    options.setdefault("roles", CLI_ROLES)
    return join_tables([read_owner_table(path, **options) for path in paths])


def warm_start(folder: Path, args: Any, target: str, features: Sequence[str], key: bytes | None) -> Any:
    """``fedgp fit --warm-start MODEL``'s spec: the model folder's kernel and mean, its learned state
    as their initial values (:meth:`fedgp.run.FitResult.warm_spec`). The folder's target and features
    must be this table's, and ``--kernel``, ``--mean`` and ``--ard`` are refused (the model's are used).
    The state is in the earlier run's units; this run learns its transforms again from its rows."""
    from fedgp import defaults
    from fedgp.run import load

    given = [
        flag
        for flag, value, default in [
            ("--kernel", args.kernel, defaults.KERNEL),
            ("--mean", args.mean, defaults.MEAN),
            ("--ard/--no-ard", args.ard, defaults.ARD),
        ]
        if value != default
    ]
    if given:
        raise CommandError(
            f"--warm-start {folder}: {', '.join(given)} cannot be given with it: the run continues the "
            "model's own kernel and mean"
        )
    columns = read_columns(folder)
    if columns["target"] != target or list(columns["features"]) != list(features):
        raise CommandError(
            f"--warm-start {folder}: the model was fitted to target {columns['target']!r} from features "
            f"{columns['features']}, this table's are {target!r} from {list(features)}: continue with "
            "the same columns (--target, --features)"
        )
    try:
        return load(folder / MODEL_FILE, key=key).warm_spec()
    except ValueError as err:  # a sealed file without its key, a clustered model's states
        raise CommandError(f"--warm-start {folder}: {err}") from None
