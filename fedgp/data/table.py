"""A table whose owner column says which client holds each row: CSV files in, clients out.

``fedgp fit`` and ``fedgp predict`` read their data through :func:`read_owner_table`, which checks
every cell where it enters and names the file, the column, the line and the owner of anything it
refuses (a missing column, a cell that is not a number, a date, time or duration, an empty cell,
inf, an owner too small to train on), as a :class:`TableError`. Lines are the file's own: the
header is line 1, the first row line 2 (what a text editor and a spreadsheet both show).
:func:`rows_by_owner` groups rows by owner label for any caller (the scikit-learn estimator too).

The separator is sniffed from the header line: a comma unless the header has none and splits on a
tab or a semicolon (or the file ends in ``.tsv``: tabs), so a TSV or a ``;``-separated export reads
as it is. Messages name the columns' roles as the caller's door names them (``roles``: the CLI's
flags, the Flower app's run-config keys, Python's argument names).
"""

from __future__ import annotations

import csv
import datetime
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedgp.data.client import MIN_TRAINING_POINTS, ClientData, Federation
from fedgp.errors import InputError, TableError, import_extra, missing_extra

__all__ = [
    "OwnerTable",
    "read_owner_table",
    "join_tables",
    "rows_by_owner",
    "owner_codes",
    "PYTHON_ROLES",
    "CLI_ROLES",
    "RUN_CONFIG_ROLES",
]

#: How each door names the roles of a table's columns, for its messages: ``group`` (the owner
#: column), ``target`` and ``features``. Python: :func:`read_owner_table`'s arguments.
PYTHON_ROLES = {"group": "group=", "target": "target=", "features": "features=[...]"}
#: ``fedgp fit`` and ``fedgp predict``: their flags.
CLI_ROLES = {"group": "--group", "target": "--target", "features": "--features"}
#: fedgp's Flower app: its run-config keys.
RUN_CONFIG_ROLES = {
    "group": "run config 'group'",
    "target": "run config 'target'",
    "features": "run config 'features'",
}


def owner_codes(labels: Any) -> tuple[np.ndarray, list]:
    """Each row's owner as a code ``0..K-1``, owners numbered in order of first appearance, and the
    ``K`` labels as Python scalars (``numpy.int64(3)`` becomes ``3``).

    A pandas ``Series`` is coded as it is, without a Python object per row (10⁶ owners' text labels
    stay in pyarrow's buffers). A missing label (``None``/NaN) raises ``InputError`` with the first such
    row (0-based)."""
    if not isinstance(labels, pd.Series):
        labels = np.asarray(labels, dtype=object)
        if labels.ndim != 1:
            raise InputError(f"owner labels must be one per row (1-D), got shape {labels.shape}")
    codes, uniques = pd.factorize(labels, use_na_sentinel=True)
    if (codes < 0).any():
        raise InputError(f"row {int(np.flatnonzero(codes < 0)[0])} has no owner label (None/NaN)")
    return codes, [u.item() if hasattr(u, "item") else u for u in uniques]


def rows_by_owner(labels: Any) -> dict[Any, np.ndarray]:
    """Row indices of each owner label, owners in order of first appearance (:func:`owner_codes`).

    Labels are returned as Python scalars (``numpy.int64(3)`` becomes ``3``). A missing label
    (``None``/NaN) raises ``ValueError`` with the first such row (0-based).
    """
    codes, names = owner_codes(labels)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    groups = np.split(order, bounds)
    return dict(zip(names, groups))


@dataclass(frozen=True)
class OwnerTable:
    """Checked rows of a table: inputs ``X``, target ``y`` (``None`` when no target was asked for),
    the owner of each row (the ``Series`` as read: no Python object per row), the file's line of each
    row, and the table as read (``frame``)."""

    source: str
    group: str
    features: tuple[str, ...]
    target: str | None
    X: np.ndarray
    y: np.ndarray | None
    owners: pd.Series
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
        codes, ids = owner_codes(self.owners)
        sizes = np.bincount(codes, minlength=len(ids))
        if (sizes < need).any():
            first = int(np.flatnonzero(sizes < need)[0])  # in order of first appearance
            where = ", ".join(f"line {int(line)}" for line in self.lines[codes == first])
            held = " with a test split (2 to train on, 1 held out)" if test_fraction else ""
            raise TableError(
                f"{self.source}: owner {ids[first]!r} has {int(sizes[first])} row(s) ({where}); training "
                f"needs at least {need} per owner{held}. Leave its rows out of the training table: the "
                "fitted model can still predict for it as a new owner (fedgp predict --data)"
            )
        # each owner's rows end to end, in the file's order: one copy of the table, one slice per owner
        # (10⁶ owners: no index array or tensor per owner, and the rows are checked once for all)
        order = np.argsort(codes, kind="stable")
        try:
            fed = Federation.from_runs(
                self.X[order], self._targets()[order], sizes, ids=ids, feature_names=self.features
            )
        except ValueError as err:
            raise TableError(f"{self.source}: {err}") from None
        return fed if not test_fraction else fed.split(test_fraction, seed)


def join_tables(tables: Sequence[OwnerTable]) -> OwnerTable:
    """Several tables of the same columns as one, their rows in the tables' order: owners whose rows
    are held in more than one file (a training table and the rows added since). ``source`` names
    every file; ``lines`` are each row's line in its own file."""
    first = tables[0]
    if len(tables) == 1:
        return first
    return OwnerTable(
        source=" + ".join(t.source for t in tables),
        group=first.group,
        features=first.features,
        target=first.target,
        X=np.concatenate([t.X for t in tables]),
        y=None if first.y is None else np.concatenate([t.y for t in tables]),
        owners=pd.concat([t.owners for t in tables], ignore_index=True),
        lines=np.concatenate([t.lines for t in tables]),
        frame=pd.concat([t.frame for t in tables], ignore_index=True),
    )


def read_owner_table(
    path: str | os.PathLike,
    *,
    group: str,
    target: str | None = None,
    features: Sequence[str] | None = None,
    roles: Mapping[str, str] | None = None,
) -> OwnerTable:
    """Read and check a CSV file (or a Parquet file, ``.parquet``/``.pq``, with pyarrow) with an
    owner column ``group``.

    ``features`` default to every column but ``group`` and ``target``. The owner labels are read as
    text (so ``7`` and ``007`` are different owners, and a label is the same in every file), the
    feature and target columns as numbers (a Parquet date, time or duration column is refused, as a
    date in a CSV file is: convert it to numbers first); an owner labelled ``NA``, ``None``,
    ``null``, ``nan`` ... keeps that label (only an empty owner cell is missing). Blank lines are
    skipped. A column named twice in the header, or ``target`` equal to ``group``, is refused. The
    separator is a comma, or a tab or a semicolon when the header line has no comma and splits on
    one (a ``.tsv`` file: tabs).
    ``roles``: how the caller's door names the ``group``, ``target`` and ``features`` settings in
    messages (:data:`CLI_ROLES`, :data:`RUN_CONFIG_ROLES`; default :data:`PYTHON_ROLES`). Raises
    :class:`TableError`.
    """
    names = {**PYTHON_ROLES, **(roles or {})}
    source = str(path)
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{source}: {'is a folder, not a file' if path.is_dir() else 'no such file'}")
    separator = ","
    if path.suffix.lower() in PARQUET:
        frame = _read_parquet(path, group)
    else:
        separator = _separator(path)
        frame = _read_csv(path, group, separator)
    lines = np.arange(len(frame)) + 2  # the header is line 1
    blank = frame.isna().all(axis=1).to_numpy()
    frame, lines = frame.loc[~blank].reset_index(drop=True), lines[~blank]
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    if target is not None and target == group:
        raise TableError(
            f"{source}: {names['target']} and {names['group']} both name column {group!r}; the owner column "
            "says who holds each row and cannot also be the value to predict"
        )
    roles_of = {group: names["group"], **({target: names["target"]} if target is not None else {})}
    wanted = list(features) if features is not None else [c for c in columns if c not in roles_of]
    if features is not None and len(set(wanted)) != len(wanted):
        raise TableError(f"{source}: a feature column is named twice in {wanted} ({names['features']})")
    for name, role in [*roles_of.items(), *((f, names["features"]) for f in wanted)]:
        if name not in frame.columns:
            read_as = "" if separator == "," else f", read as {SEPARATORS[separator]}-separated"
            raise TableError(
                f"{source}: no column {name!r} ({role}); its columns are {', '.join(map(repr, columns))}"
                f"{read_as}"
            )
    if target in wanted or group in wanted:
        clash = target if target in wanted else group
        what = "target" if clash == target else "owner column"
        raise TableError(
            f"{source}: column {clash!r} cannot be both a feature ({names['features']}) and the {what} "
            f"({roles_of[clash]})"
        )
    if not wanted:
        raise TableError(f"{source}: no feature columns (the table has only {', '.join(roles_of)})")
    if not len(frame):
        raise TableError(f"{source}: the table has a header but no rows")
    owners = frame[group]
    missing = owners.isna().to_numpy()
    if missing.any():
        raise TableError(f"{source}: column {group!r}, line {int(lines[missing][0])}: no owner (empty cell)")
    if features is None:  # a text column among the defaults: say how to leave it out
        text = (
            f"a feature must be a number: choose the feature columns with {names['features']} (by "
            "default every column but the owner and target columns is one)"
        )
    else:
        text = f"every feature ({names['features']}) must be a number"
    X = np.column_stack([_numbers(frame, c, source, lines, owners, group, text) for c in wanted])
    y = None if target is None else _numbers(frame, target, source, lines, owners, group)
    return OwnerTable(source, group, tuple(wanted), target, X, y, owners, lines, frame)


#: File suffixes read as Parquet; every other file is read as CSV.
PARQUET = (".parquet", ".pq")


#: The cells pandas reads as missing by default ("NA", "None", "null", "nan", "N/A", "", ...): missing
#: in a feature or target column, but an owner's name in the owner column.
try:
    from pandas._libs.parsers import STR_NA_VALUES as _NA_CELLS
except ImportError:  # pragma: no cover - pandas moved it
    _NA_CELLS = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                 "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}  # fmt: skip


#: The separators a CSV file's header line is sniffed for, in order, and their names in messages.
SEPARATORS = {",": "comma", "\t": "tab", ";": "semicolon"}


def _separator(path: Path) -> str:
    """The file's separator: a tab for ``.tsv``; else the first of :data:`SEPARATORS` that splits the
    header (the first non-blank line) into more than one column; a comma for a one-column header.
    A comma-separated file is read as a comma-separated file whatever else its header holds."""
    if path.suffix.lower() == ".tsv":
        return "\t"
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            line = next((text for text in handle if text.strip()), "").rstrip("\r\n")
    except (UnicodeDecodeError, OSError) as err:
        raise TableError(f"{path}: cannot be read as a CSV table ({str(err).strip()})") from None
    for separator in SEPARATORS:
        try:
            if len(next(csv.reader([line], delimiter=separator), [])) > 1:
                return separator
        except csv.Error:
            continue
    return ","


def _read_csv(path: Path, group: str, separator: str = ",") -> pd.DataFrame:
    header = _csv_header(path, separator)
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
            path, sep=separator, dtype={group: str}, skip_blank_lines=False, keep_default_na=False,
            na_values=na,
        )  # fmt: skip
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as err:
        raise TableError(f"{path}: cannot be read as a CSV table ({str(err).strip()})") from None


def _csv_header(path: Path, separator: str = ",") -> list[str]:
    """The column names of the CSV file's header (its first non-blank line) as written, before pandas
    renames a repeated one (``y``, ``y`` becomes ``y``, ``y.1``)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            for row in csv.reader(handle, delimiter=separator):
                if any(cell.strip() for cell in row):
                    return row
    except (csv.Error, UnicodeDecodeError, OSError) as err:
        raise TableError(f"{path}: cannot be read as a CSV table ({str(err).strip()})") from None
    return []


def _read_parquet(path: Path, group: str) -> pd.DataFrame:
    import_extra("pyarrow", f"{path}: reading Parquet")
    try:
        frame = pd.read_parquet(path)
    except ImportError as err:  # pandas found no usable engine (a pyarrow too old, or broken)
        raise missing_extra("pyarrow", f"{path}: reading Parquet", getattr(err, "name", None)) from None
    except (OSError, ValueError) as err:
        raise TableError(f"{path}: cannot be read as a Parquet table ({str(err).strip()})") from None
    twice = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    if twice:
        raise TableError(f"{path}: columns {', '.join(map(repr, twice))} appear more than once")
    if group in frame.columns:  # owner labels as text, as the CSV reader reads them
        frame[group] = frame[group].map(lambda v: None if pd.isna(v) else str(v)).astype(object)
    return frame


#: What a date or time cell is, by kind, and how to make it a number, for messages. No reader
#: converts one: a CSV date is text, and a Parquet date (which pandas could read as microseconds or
#: nanoseconds since 1970, by the file's unit) is refused the same way.
TEMPORAL = {
    "datetime": ("a date and time", "e.g. days or seconds since a reference date"),
    "date": ("a date", "e.g. the number of days since a reference date"),
    "time": ("a time of day", "e.g. seconds since midnight"),
    "duration": ("a duration", "e.g. a number of days or seconds"),
    "period": ("a period of time", "e.g. the number of days since a reference date to its start"),
}


def _temporal_kind(value: Any) -> str | None:
    """The :data:`TEMPORAL` kind of one cell (``None``: not a date, a time or a duration)."""
    if isinstance(value, (datetime.datetime, np.datetime64)):  # pd.Timestamp too
        return "datetime" if not pd.isna(value) else None
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, datetime.time):
        return "time"
    if isinstance(value, (datetime.timedelta, np.timedelta64)):  # pd.Timedelta too
        return "duration" if not pd.isna(value) else None
    if isinstance(value, pd.Period):
        return "period"
    return None


def _temporal(values: pd.Series) -> pd.Series | None:
    """Each cell's :data:`TEMPORAL` kind (missing where a cell is none), or ``None`` when the column
    holds no date, time or duration: a datetime64, timedelta64 or period column, a pyarrow-backed
    date, time, timestamp or duration column, or an object column of ``datetime`` objects (how
    pandas reads a Parquet ``date32``)."""
    dtype = values.dtype
    kind = None
    if isinstance(dtype, pd.ArrowDtype):
        import pyarrow as pa

        arrow = dtype.pyarrow_dtype
        kind = next(
            (name for name, test in (("datetime", pa.types.is_timestamp), ("date", pa.types.is_date),
                                     ("time", pa.types.is_time), ("duration", pa.types.is_duration))
             if test(arrow)), None,
        )  # fmt: skip
    elif isinstance(dtype, pd.DatetimeTZDtype) or getattr(dtype, "kind", "") == "M":
        kind = "datetime"
    elif getattr(dtype, "kind", "") == "m":
        kind = "duration"
    elif isinstance(dtype, pd.PeriodDtype):
        kind = "period"
    elif pd.api.types.is_object_dtype(dtype):
        kinds = values.map(_temporal_kind)
        return kinds if kinds.notna().any() else None
    if kind is None:
        return None
    # a column of this dtype is a date column even when every cell is missing (NaT is not a number)
    return pd.Series(np.where(values.notna().to_numpy(), kind, None), index=values.index, dtype=object)


def _numbers(
    frame: pd.DataFrame, column: str, source: str, lines, owners, group: str, text: str = ""
) -> np.ndarray:
    """Column ``column`` as float64, refusing the first cell that is not a finite number by line
    (``text``: what to do about a cell of text, added to its message)."""
    values = frame[column]

    def where(mask) -> str:
        i = int(np.flatnonzero(mask)[0])
        return f"{source}: column {column!r}, line {int(lines[i])} ({group} {owners.iloc[i]!r})"

    kinds = _temporal(values)
    if kinds is not None:  # a date is not read as a number (Parquet's microseconds since 1970)
        if pd.api.types.is_object_dtype(
            values.dtype
        ):  # the first cell that is not a number, be it a date or text
            numbers = pd.to_numeric(values.where(kinds.isna()), errors="coerce")
            bad = (values.notna() & (kinds.notna() | numbers.isna())).to_numpy()
        else:
            bad = kinds.notna().to_numpy()
        i = int(np.flatnonzero(bad)[0]) if bad.any() else None
        if i is not None and pd.notna(kinds.iloc[i]):
            what, how = TEMPORAL[kinds.iloc[i]]
            raise TableError(
                f"{where(bad)}: {str(values.iloc[i])!r} is {what}, not a number; convert the column to "
                f"numbers first ({how})" + (f"; {text}" if text else "")
            )
        if i is None:  # every cell missing (NaT): refused below as missing, not read as a number
            values = pd.Series(np.nan, index=values.index)
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
            raise TableError(
                f"{where(bad)}: {values.iloc[i]!r} is not a number" + (f"; {text}" if text else "")
            )
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
