"""A table whose owner column says which client holds each row: CSV files in, clients out.

``fedgp fit`` and ``fedgp predict`` read their data through :func:`read_owner_table`, which checks
every cell where it enters and names the file, the column, the line and the owner of anything it
refuses (a missing column, a cell that is not a number, an empty cell, inf, an owner too small to
train on), as a :class:`TableError`. Lines are the file's own: the header is line 1, the first
row line 2 (what a text editor and a spreadsheet both show). :func:`rows_by_owner` groups rows by
owner label for any caller (the scikit-learn estimator too).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedgp.data.client import MIN_TRAINING_POINTS, ClientData, Federation
from fedgp.errors import InputError, MissingExtraError, TableError

__all__ = ["OwnerTable", "read_owner_table", "rows_by_owner"]


def rows_by_owner(labels: Any) -> dict[Any, np.ndarray]:
    """Row indices of each owner label, owners in order of first appearance.

    Labels are returned as Python scalars (``numpy.int64(3)`` becomes ``3``). A missing label
    (``None``/NaN) raises ``ValueError`` with the first such row (0-based).
    """
    labels = np.asarray(labels, dtype=object) if not isinstance(labels, pd.Series) else labels.to_numpy()
    if labels.ndim != 1:
        raise InputError(f"owner labels must be one per row (1-D), got shape {labels.shape}")
    codes, uniques = pd.factorize(labels, use_na_sentinel=True)
    if (codes < 0).any():
        raise InputError(f"row {int(np.flatnonzero(codes < 0)[0])} has no owner label (None/NaN)")
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    groups = np.split(order, bounds)
    names = [u.item() if hasattr(u, "item") else u for u in uniques]
    return dict(zip(names, groups))


@dataclass(frozen=True)
class OwnerTable:
    """Checked rows of a table: inputs ``X``, target ``y`` (``None`` when no target was asked for),
    the owner of each row, the file's line of each row, and the table as read (``frame``)."""

    source: str
    group: str
    features: tuple[str, ...]
    target: str | None
    X: np.ndarray
    y: np.ndarray | None
    owners: np.ndarray
    lines: np.ndarray
    frame: pd.DataFrame

    def rows(self) -> dict[Any, np.ndarray]:
        """Row positions of each owner, in order of first appearance."""
        return rows_by_owner(self.owners)

    def client(self, owner: Any, rows: np.ndarray | None = None) -> ClientData:
        """Owner ``owner``'s rows as a ``ClientData`` (any number of rows: for prediction)."""
        rows = self.rows()[owner] if rows is None else rows
        try:
            return ClientData(self.X[rows], self._targets()[rows], id=owner, feature_names=self.features)
        except ValueError as err:
            raise TableError(f"{self.source}: {err}") from None

    def _targets(self) -> np.ndarray:
        if self.y is None:
            raise TableError(f"{self.source}: no target column was read, so it holds no training data")
        return self.y

    def federation(self, test_fraction: float | None = None, seed: int = 0) -> Federation:
        """One client per owner, for training: each owner needs 2 rows (3 with a test split: 2 to
        train on, 1 held out). ``test_fraction`` moves that share of each owner's rows into its
        test split (:meth:`Federation.split`, seeded)."""
        if test_fraction is not None and not 0.0 < test_fraction < 1.0:
            raise TableError(f"the test fraction must be in (0, 1), got {test_fraction}")
        need = MIN_TRAINING_POINTS + (1 if test_fraction else 0)
        groups = self.rows()
        for owner, rows in groups.items():
            if len(rows) < need:
                where = ", ".join(f"line {int(line)}" for line in self.lines[rows])
                held = " with a test split (2 to train on, 1 held out)" if test_fraction else ""
                raise TableError(
                    f"{self.source}: owner {owner!r} has {len(rows)} row(s) ({where}); training needs at "
                    f"least {need} per owner{held}. Leave its rows out of the training table: the "
                    "fitted model can still predict for it as a new owner (fedgp predict --data)"
                )
        try:  # the rows are checked once for all owners, not owner by owner (10⁶ owners in seconds)
            fed = Federation.from_partition(
                self.X, self._targets(), list(groups.values()), ids=list(groups), feature_names=self.features
            )
        except ValueError as err:
            raise TableError(f"{self.source}: {err}") from None
        return fed if not test_fraction else fed.split(test_fraction, seed)


def read_owner_table(
    path: str | os.PathLike,
    *,
    group: str,
    target: str | None = None,
    features: Sequence[str] | None = None,
) -> OwnerTable:
    """Read and check a CSV file (or a Parquet file, ``.parquet``/``.pq``, with pyarrow) with an
    owner column ``group``.

    ``features`` default to every column but ``group`` and ``target``. The owner labels are read as
    text (so ``7`` and ``007`` are different owners, and a label is the same in every file), the
    feature and target columns as numbers; an owner labelled ``NA``, ``None``, ``null``, ``nan`` ...
    keeps that label (only an empty owner cell is missing). Blank lines are skipped. A column named
    twice in the header, or ``target`` equal to ``group``, is refused. Raises :class:`TableError`.
    """
    source = str(path)
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{source}: {'is a folder, not a file' if path.is_dir() else 'no such file'}")
    frame = _read_parquet(path, group) if path.suffix.lower() in PARQUET else _read_csv(path, group)
    lines = np.arange(len(frame)) + 2  # the header is line 1
    blank = frame.isna().all(axis=1).to_numpy()
    frame, lines = frame.loc[~blank].reset_index(drop=True), lines[~blank]
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    if target is not None and target == group:
        raise TableError(
            f"{source}: --target and --group both name column {group!r}; the owner column says who holds "
            "each row and cannot also be the value to predict"
        )
    roles = {group: "--group", **({target: "--target"} if target is not None else {})}
    wanted = list(features) if features is not None else [c for c in columns if c not in roles]
    if features is not None and len(set(wanted)) != len(wanted):
        raise TableError(f"{source}: a feature column is named twice in {wanted}")
    for name, role in [*roles.items(), *((f, "feature") for f in wanted)]:
        if name not in frame.columns:
            raise TableError(
                f"{source}: no column {name!r} ({role}); its columns are {', '.join(map(repr, columns))}"
            )
    if target in wanted or group in wanted:
        clash = target if target in wanted else group
        raise TableError(f"{source}: column {clash!r} cannot be both a feature and the {roles[clash]}")
    if not wanted:
        raise TableError(f"{source}: no feature columns (the table has only {', '.join(roles)})")
    if not len(frame):
        raise TableError(f"{source}: the table has a header but no rows")
    owners = frame[group]
    missing = owners.isna().to_numpy()
    if missing.any():
        raise TableError(f"{source}: column {group!r}, line {int(lines[missing][0])}: no owner (empty cell)")
    X = np.column_stack([_numbers(frame, c, source, lines, owners, group) for c in wanted])
    y = None if target is None else _numbers(frame, target, source, lines, owners, group)
    return OwnerTable(source, group, tuple(wanted), target, X, y, owners.to_numpy(dtype=object), lines, frame)


#: File suffixes read as Parquet; every other file is read as CSV.
PARQUET = (".parquet", ".pq")


#: The cells pandas reads as missing by default ("NA", "None", "null", "nan", "N/A", "", ...): missing
#: in a feature or target column, but an owner's name in the owner column.
try:
    from pandas._libs.parsers import STR_NA_VALUES as _NA_CELLS
except ImportError:  # pragma: no cover - pandas moved it
    _NA_CELLS = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                 "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}  # fmt: skip


def _read_csv(path: Path, group: str) -> pd.DataFrame:
    header = _csv_header(path)
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise TableError(
            f"{path}: the header names {'column' if len(twice) == 1 else 'columns'} "
            f"{', '.join(map(repr, twice))} more than once; give every column its own name"
        )
    # Only an empty owner cell is missing: an owner called "NA" or "None" keeps its name.
    na = {name: ([""] if name == group else sorted(_NA_CELLS)) for name in header}
    try:
        # pandas' default float parser reads what to_csv/repr write back exactly (tested).
        return pd.read_csv(
            path, dtype={group: str}, skip_blank_lines=False, keep_default_na=False, na_values=na
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as err:
        raise TableError(f"{path}: cannot be read as a CSV table ({str(err).strip()})") from None


def _csv_header(path: Path) -> list[str]:
    """The column names of the CSV file's header (its first non-blank line) as written, before pandas
    renames a repeated one (``y``, ``y`` becomes ``y``, ``y.1``)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            for row in csv.reader(handle):
                if any(cell.strip() for cell in row):
                    return row
    except (csv.Error, UnicodeDecodeError, OSError) as err:
        raise TableError(f"{path}: cannot be read as a CSV table ({str(err).strip()})") from None
    return []


def _read_parquet(path: Path, group: str) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except ImportError:
        raise MissingExtraError(
            f"{path}: reading Parquet needs pyarrow (pip install 'fedgp-gpytorch[parquet]')"
        ) from None
    except (OSError, ValueError) as err:
        raise TableError(f"{path}: cannot be read as a Parquet table ({str(err).strip()})") from None
    twice = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    if twice:
        raise TableError(f"{path}: columns {', '.join(map(repr, twice))} appear more than once")
    if group in frame.columns:  # owner labels as text, as the CSV reader reads them
        frame[group] = frame[group].map(lambda v: None if pd.isna(v) else str(v)).astype(object)
    return frame


def _numbers(frame: pd.DataFrame, column: str, source: str, lines, owners, group: str) -> np.ndarray:
    """Column ``column`` as float64, refusing the first cell that is not a finite number by line."""
    values = frame[column]

    def where(mask) -> str:
        i = int(np.flatnonzero(mask)[0])
        return f"{source}: column {column!r}, line {int(lines[i])} ({group} {owners.iloc[i]!r})"

    if pd.api.types.is_bool_dtype(values.dtype):
        raise TableError(
            f"{where(np.ones(len(values), bool))}: true/false values; a feature or target must be a number "
            "(encode them as 0/1)"
        )
    if not pd.api.types.is_numeric_dtype(values.dtype):
        numbers = pd.to_numeric(values, errors="coerce")
        bad = (values.notna() & numbers.isna()).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TableError(f"{where(bad)}: {values.iloc[i]!r} is not a number")
        values = numbers
    array = values.to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isnan(array).any():
        raise TableError(
            f"{where(np.isnan(array))}: missing value (an empty or NA cell); fill or drop the row"
        )
    if not np.isfinite(array).all():
        raise TableError(
            f"{where(~np.isfinite(array))}: {array[~np.isfinite(array)][0]} is not a finite number"
        )
    return array
