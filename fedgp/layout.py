"""The files of a model folder: what ``fedgp fit --out`` and fedgp's Flower app (``out-dir``)
write, and what ``fedgp predict`` reads. One place, so that the two writers cannot drift apart. Each
file is written atomically (:func:`fedgp.files.write_atomically`): a reader, or a writer killed
half-way, sees the old file or the new one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedgp.errors import CommandError
from fedgp.files import write_atomically

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MODEL_FILE",
    "COLUMNS_FILE",
    "COLUMNS_FORMAT",
    "HISTORY_FILE",
    "TRANSFORMS_FILE",
    "TRANSFORMS_FORMAT",
    "PROGRESS_FILE",
    "ERROR_FILE",
    "write_progress",
    "write_error",
    "run_state",
    "owner_metrics",
    "write_columns",
    "read_columns",
    "write_history",
    "write_model_folder",
    "write_table",
]

#: The saved model (``FitResult.save``'s sealed container, :mod:`fedgp.run.saved`; ``fedgp.load``).
MODEL_FILE = "model.fedgp"
#: The feature, target and owner columns the model was trained on (JSON), which ``fedgp predict``
#: reads to know which columns of a new table are its inputs.
COLUMNS_FILE = "columns.json"
#: The ``format`` field of a ``columns.json`` (what ``fedgp predict`` checks before trusting it).
COLUMNS_FORMAT = "fedgp.cli.columns"
#: One row per round, the hyper-parameters in the data's units (:mod:`fedgp.run.units`).
HISTORY_FILE = "history.csv"
#: The data transforms the model was trained under, as numbers, and the units of every column of
#: ``history.csv`` (JSON).
TRANSFORMS_FILE = "transforms.json"
#: The ``format`` field of a ``transforms.json``.
TRANSFORMS_FORMAT = "fedgp.cli.transforms"
#: fedgp's Flower app, while its run goes: the number of rounds completed (0 once the run has
#: started), rewritten after every round.
PROGRESS_FILE = "progress.txt"
#: fedgp's Flower app, when its run fails: why, on one line (removed when a run starts).
ERROR_FILE = "error.txt"


def write_progress(folder: Path, completed: int) -> Path:
    """``progress.txt``: ``completed`` rounds, atomically (a reader never sees it half-written)."""
    path = Path(folder) / PROGRESS_FILE
    write_atomically(path, f"{int(completed)}\n".encode())
    return path


def write_error(folder: Path, reason: str) -> Path:
    """``error.txt``: why the run failed, on one line, atomically."""
    path = Path(folder) / ERROR_FILE
    line = "; ".join(part.strip() for part in str(reason).splitlines() if part.strip())
    write_atomically(path, f"{line}\n".encode())
    return path


def run_state(folder: str | Path) -> tuple[str, str]:
    """The state of a run of fedgp's Flower app, from its ``out-dir`` (``fedgp flower status``):
    ``("failed", why)`` when ``error.txt`` is there, ``("finished", ...)`` when ``model.fedgp`` was
    written after the last ``progress.txt``, ``("running", ...)`` when only ``progress.txt`` is
    there or it is newer (a later run), ``("none", ...)`` when the folder holds none of them."""
    import datetime
    import time

    folder = Path(folder)
    error, progress, model = folder / ERROR_FILE, folder / PROGRESS_FILE, folder / MODEL_FILE
    if not folder.is_dir():
        return "none", f"{folder}: no such folder"
    if error.is_file():
        return "failed", error.read_text(errors="replace").strip() or "(error.txt is empty)"
    try:
        rounds = int(progress.read_text().strip()) if progress.is_file() else None
    except ValueError:
        rounds = None
    if model.is_file() and (not progress.is_file() or model.stat().st_mtime >= progress.stat().st_mtime):
        when = datetime.datetime.fromtimestamp(model.stat().st_mtime).isoformat(" ", "seconds")
        done = f"{rounds} round(s), " if rounds is not None else ""
        return "finished", f"{done}{MODEL_FILE} written {when}"
    if progress.is_file():
        ago = max(0.0, time.time() - progress.stat().st_mtime)
        completed = "?" if rounds is None else rounds
        return "running", f"{completed} round(s) completed, the last update {ago:.0f} s ago"
    return "none", f"{folder}: no {PROGRESS_FILE}, {MODEL_FILE} or {ERROR_FILE} (no run has started here)"


def write_table(frame: pd.DataFrame, path: Path) -> Path:
    """Write ``frame`` as CSV (no index) to ``path`` atomically; returns ``path``."""
    write_atomically(Path(path), frame.to_csv(index=False).encode())
    return Path(path)


def _write_json(document: dict, path: Path) -> Path:
    write_atomically(path, (json.dumps(document, indent=2) + "\n").encode())
    return path


def write_columns(
    folder: Path,
    *,
    group: str,
    target: str,
    features: Sequence[str],
    owners: Sequence,
    data: str | None,
    test_fraction: float | None,
    seed: int,
) -> Path:
    """Write ``folder/columns.json``: the columns a model was trained on, its owners (as text), the
    training table (``None`` where none was one file) and the test split's fraction and seed."""
    columns = {"format": COLUMNS_FORMAT, "version": 1, "group": group, "target": target,
               "features": list(features), "owners": [str(o) for o in owners], "data": data,
               "test_fraction": test_fraction, "seed": seed}  # fmt: skip
    return _write_json(columns, Path(folder) / COLUMNS_FILE)


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


def write_model_folder(
    folder: str | Path,
    result: Any,
    columns: Mapping[str, Any],
    *,
    metrics: pd.DataFrame | None = None,
    key: bytes | str | None = None,
) -> list[Path]:
    """A model folder as ``fedgp fit`` and fedgp's Flower app write it: ``history.csv`` and
    ``transforms.json`` (:func:`write_history`), ``failures.csv``, ``metrics.csv`` when given,
    ``columns.json`` (:func:`write_columns` of ``columns``), and last ``model.fedgp`` (sealed with
    ``key`` when given): once it exists the folder is complete, so a script that waits for it never
    reads a half-written folder. The model records ``columns["features"]`` as its feature names
    (a result that names other columns is refused: the folder would contradict itself). Returns the
    paths."""
    import dataclasses

    from fedgp.errors import InputError

    features = tuple(columns["features"])
    if result.feature_names is not None and tuple(result.feature_names) != features:
        raise InputError(
            f"the model names its features {list(result.feature_names)} but the folder's columns are "
            f"{list(features)}: they must be the same columns in the same order"
        )
    result = dataclasses.replace(result, feature_names=features)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = [*write_history(folder, result, columns["features"])]
    written.append(write_table(result.failures, folder / "failures.csv"))
    if metrics is not None:
        written.append(write_table(metrics, folder / "metrics.csv"))
    written.append(write_columns(folder, **columns))
    written.append(result.save(folder / MODEL_FILE, key=key))
    return written


def write_history(folder: Path, result: Any, features: Sequence[str]) -> list[Path]:
    """Write ``history.csv`` (``result.history`` with its hyper-parameters in the data's units,
    :func:`fedgp.run.units.history_in_data_units`) and ``transforms.json`` (the transforms'
    numbers and each column's units) for a :class:`fedgp.FitResult` trained on columns ``features``.
    Returns the two paths."""
    from fedgp.run.units import history_in_data_units  # not at import: fedgp's CLI reads the names above

    transform = result.transform
    history, units = history_in_data_units(result, features)
    history_path = write_table(history, Path(folder) / HISTORY_FILE)
    if transform.y_local:
        outcome: dict[str, Any] = {
            "transform": "standardize",
            "per_owner": True,
            "map": "y' = (y - mean) / sd with each owner's own mean and sd (they never left the owner)",
        }
    elif transform.y_offset is not None:
        outcome = {"transform": "standardize", "per_owner": False, "mean": float(transform.y_offset),
                   "sd": float(transform.y_scale), "map": "y' = (y - mean) / sd"}  # fmt: skip
    else:
        outcome = {"transform": "none"}
    inputs: dict[str, Any] = {"transform": "none"}
    if transform.x_offset is not None:
        lower, span = transform.x_offset.tolist(), transform.x_scale.tolist()
        inputs = {"transform": "normalize", "lower": dict(zip(features, lower)),
                  "upper": {f: lo + w for f, lo, w in zip(features, lower, span)},
                  "map": "x' = (x - lower) / (upper - lower), per feature"}  # fmt: skip
    document = {"format": TRANSFORMS_FORMAT, "version": 1, "outcome": outcome, "inputs": inputs,
                "note": transform.note, "history_units": units}  # fmt: skip
    return [history_path, _write_json(document, Path(folder) / TRANSFORMS_FILE)]


def owner_metrics(
    result: Any,
    federation: Any,
    held_out: bool,
    progress: Callable[[Iterable], Iterable] | None = None,
) -> pd.DataFrame:
    """``metrics.csv`` of a :class:`fedgp.FitResult` trained on a ``Federation``: per-owner RMSE,
    NLL and 95 % coverage in the original units: on each owner's held-out rows
    (``result.evaluate()``) with a test split; else in-sample, each owner's posterior at its own
    training rows (optimistic: those rows are what it conditions on), and the table says which.
    ``progress`` wraps the in-sample loop over the owners (e.g. in a progress bar)."""
    import pandas as pd

    sizes = dict(zip(federation.ids, federation.sizes.tolist()))
    if held_out:
        table = result.evaluate().rename(columns={"client": "owner"})
        table.insert(1, "n_train", [sizes[o] for o in table["owner"]])
        return table.assign(split="held-out")
    rows = []
    for position, client in enumerate(federation if progress is None else progress(federation)):
        pred = result.posterior(client.X, client=position)
        rows.append(
            {
                "owner": client.id,
                "n_train": client.n,
                "n_test": 0,
                "rmse": pred.rmse(client.y),
                "nll": pred.nll(client.y),
                "coverage95": pred.coverage(client.y),
            }
        )
    return pd.DataFrame(rows).assign(split="in-sample (training rows)")
