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

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedgp.errors import CommandError, InputError
from fedgp.layout import COLUMNS_FILE, COLUMNS_FORMAT, MODEL_FILE, owner_metrics
from fedgp.run.progress import progress_bar

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "claim_out",
    "read_columns",
    "read_new_table",
    "fit_metrics",
    "predict_owners",
    "OWNERS_PER_STEP",
]

#: Owners evaluated per step of the batched in-sample metrics (one progress step each).
OWNERS_PER_STEP = 20_000


def claim_out(out: Path, names: Sequence[str], force: bool) -> Path:
    """Check, before any work, that ``out`` can be a folder and that none of the files ``names`` the
    command will write there exists (unless ``force``); raises :class:`CommandError` naming them."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out} is a file, not a folder: give a folder (new or existing)")
    there = [name for name in names if (out / name).exists() or (out / name).is_symlink()]
    if there and not force:
        raise CommandError(
            f"--out {out} already holds {', '.join(there)}, which this command would overwrite; choose "
            "another --out, remove them, or pass --force to overwrite them"
        )
    return out


def read_columns(folder: Path) -> dict:
    """The column description ``fedgp fit`` wrote beside its model (JSON; checked, nothing run)."""
    path = folder / COLUMNS_FILE
    if not folder.is_dir():
        raise CommandError(f"{folder}: no such folder (give the folder fedgp fit wrote, its --out)")
    if not path.is_file() or not (folder / MODEL_FILE).is_file():
        raise CommandError(
            f"{folder}: not a folder written by fedgp fit (no {COLUMNS_FILE} and {MODEL_FILE})"
        )
    try:
        columns = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as err:
        raise CommandError(f"{path}: not JSON ({err})") from None
    ok = (
        isinstance(columns, dict)
        and columns.get("format") == COLUMNS_FORMAT
        and isinstance(columns.get("features"), list)
        and all(isinstance(f, str) for f in columns["features"])
        and all(isinstance(columns.get(k), str) for k in ("group", "target"))
    )
    if not ok:
        raise CommandError(f"{path}: not a column description written by fedgp fit")
    return columns


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
    :data:`OWNERS_PER_STEP` owners."""
    import pandas as pd

    from fedgp.engines import Batched
    from fedgp.run.exchange import ask

    clients = [_in_sample(client) for client in federation]
    engine = Batched(check=False).build(result.spec, clients, 0)
    nan = torch.full((len(clients),), math.nan, dtype=torch.float64)
    columns = {name: nan.clone() for name in ("rmse", "nll", "coverage95")}
    failures: dict[Any, str] = {}
    try:
        engine.prepare(result.strategy, 0)
        bar = progress_bar(progress=progress, desc="in-sample metrics", total=len(clients), unit="owner")
        with bar:
            for start in range(0, len(clients), OWNERS_PER_STEP):
                positions = torch.arange(start, min(start + OWNERS_PER_STEP, len(clients)))
                replies = ask(result, "evaluate", positions, engine=engine)
                for name, column in columns.items():
                    column[replies.clients] = replies.individual[name].to(torch.float64)
                failures.update({federation.ids[p]: reason for p, reason in replies.failures.items()})
                bar.update(len(positions))
    finally:
        engine.close()
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
