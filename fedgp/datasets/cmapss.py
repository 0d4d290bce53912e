"""NASA C-MAPSS turbofan degradation data (Saxena et al. 2008): one federated client per engine.

Each subset (FD001-FD004) has run-to-failure training engines, truncated test engines and the
true remaining useful life of each test engine. FGPR's NASA experiment (Yue & Kontar §6) models
one sensor of one engine as a function of time: ``x = cycle / x_scale`` on a scale shared by all
engines (so every engine's prior lives on the same time axis) and ``y`` standardised per engine.
Files are verified against ``fedgp/datasets/registry.json`` before they are parsed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedgp.data.client import ClientData, Federation
from fedgp.datasets.registry import DataRegistry, FileEntry, default_registry, locate
from fedgp.errors import DataFileError, InputError

__all__ = ["CMAPSS", "load_cmapss", "COLUMNS", "SENSORS", "SENSOR_NAMES", "SUBSETS"]

#: The four C-MAPSS subsets (operating conditions × fault modes); the paper uses FD001.
SUBSETS = ("FD001", "FD002", "FD003", "FD004")
#: Sensor columns s1..s21.
SENSORS = tuple(f"s{i}" for i in range(1, 22))
#: Column names of the train and test files, in file order.
COLUMNS = ("unit", "cycle", "op1", "op2", "op3", *SENSORS)
#: The usual sensor names (Saxena et al. 2008), e.g. s2 = T24 (LPC outlet temperature), s7 = P30.
_NAMES = "T2 T24 T30 T50 P2 P15 P30 Nf Nc epr Ps30 phi NRf NRc BPR farB htBleed Nf_dmd PCNfR_dmd W31 W32"
#: Sensor column -> its usual name, e.g. ``SENSOR_NAMES['s2'] == 'T24'``.
SENSOR_NAMES = dict(zip(SENSORS, _NAMES.split()))


def _sensor_column(sensor: str | int) -> str:
    if isinstance(sensor, (int, np.integer)) and not isinstance(sensor, bool):
        name = f"s{int(sensor)}"
    else:
        name = str(sensor)
        by_name = {v.lower(): k for k, v in SENSOR_NAMES.items()}
        name = by_name.get(name.lower(), name)
    if name not in SENSORS:
        raise InputError(
            f"unknown C-MAPSS sensor {sensor!r}; use s1..s21, 1..21 or a name such as 'T24' "
            f"({', '.join(f'{k}={v}' for k, v in SENSOR_NAMES.items())})"
        )
    return name


def _format_error(path: Path, what: str) -> DataFileError:
    return DataFileError(f"C-MAPSS file {path}: {what}", path=path, reason="format")


def _read_series_file(path: Path, entry: FileEntry) -> pd.DataFrame:
    """A train/test file as a frame with :data:`COLUMNS`, checked for the documented layout."""
    try:
        frame = pd.read_csv(path, sep=r"\s+", header=None, dtype=np.float64, engine="c")
    except (ValueError, pd.errors.ParserError) as err:
        raise _format_error(path, f"cannot be parsed as whitespace-separated numbers: {err}") from err
    if frame.shape[1] != len(COLUMNS):
        raise _format_error(
            path, f"{frame.shape[1]} columns, expected {len(COLUMNS)} ({' '.join(COLUMNS[:5])} s1..s21)"
        )
    frame.columns = list(COLUMNS)
    if frame.isna().any().any():
        row = int(np.flatnonzero(frame.isna().any(axis=1).to_numpy())[0])
        raise _format_error(path, f"missing values, first on line {row + 1}")
    expected_rows = (entry.info or {}).get("rows")
    if expected_rows is not None and len(frame) != expected_rows:
        raise _format_error(path, f"{len(frame)} rows, expected {expected_rows}")
    for col in ("unit", "cycle"):
        values = frame[col].to_numpy()
        if not np.array_equal(values, np.round(values)):
            raise _format_error(path, f"column {col!r} holds non-integers")
        frame[col] = values.astype(np.int64)
    units = frame["unit"].to_numpy()
    if np.any(np.diff(units) < 0):
        raise _format_error(path, "unit numbers are not in ascending order")
    # Within each unit the cycles run 1, 2, ..., n: a gap would be a dropped or edited line.
    first = np.r_[True, units[1:] != units[:-1]]
    starts = np.flatnonzero(first)
    expected_cycle = np.arange(len(frame)) - np.repeat(starts, np.diff(np.r_[starts, len(frame)])) + 1
    bad = np.flatnonzero(frame["cycle"].to_numpy() != expected_cycle)
    if len(bad):
        raise _format_error(
            path,
            f"unit {units[bad[0]]}: cycle {frame['cycle'].iloc[bad[0]]} on line {bad[0] + 1}, "
            f"expected {expected_cycle[bad[0]]} (cycles must run 1, 2, ... per unit)",
        )
    expected_units = (entry.info or {}).get("units")
    if expected_units is not None and len(starts) != expected_units:
        raise _format_error(path, f"{len(starts)} units, expected {expected_units}")
    return frame


def _read_rul(path: Path, n_units: int) -> pd.DataFrame:
    try:
        values = pd.read_csv(path, sep=r"\s+", header=None, dtype=np.float64)
    except (ValueError, pd.errors.ParserError) as err:
        raise _format_error(path, f"cannot be parsed: {err}") from err
    if values.shape != (n_units, 1):
        raise _format_error(path, f"shape {values.shape}, expected ({n_units}, 1): one RUL per test unit")
    return pd.DataFrame({"unit": np.arange(1, n_units + 1), "rul": values[0].to_numpy().astype(np.int64)})


@dataclass(frozen=True)
class CMAPSS:
    """One verified C-MAPSS subset.

    ``train`` and ``test`` are pandas frames with columns :data:`COLUMNS` (``unit``, ``cycle``,
    three operational settings ``op1..op3``, sensors ``s1..s21``); ``rul`` has one row per test
    unit with its true remaining useful life after the last test cycle. :meth:`federation` turns
    one sensor into a :class:`~fedgp.data.Federation` with one client per engine.
    """

    subset: str
    train: pd.DataFrame
    test: pd.DataFrame
    rul: pd.DataFrame
    paths: dict[str, Path] = field(default_factory=dict)

    def frame(self, split: str = "train") -> pd.DataFrame:
        """The ``"train"`` or ``"test"`` table as loaded."""
        if split not in ("train", "test"):
            raise InputError(f"split must be 'train' or 'test', got {split!r}")
        return self.train if split == "train" else self.test

    def units(self, split: str = "train") -> list[int]:
        """Engine unit numbers of a split, ascending."""
        return [int(u) for u in self.frame(split)["unit"].unique()]

    def series(self, unit: int, sensor: str | int = "s2", split: str = "train") -> pd.DataFrame:
        """One engine's ``cycle`` and raw sensor values."""
        column = _sensor_column(sensor)
        frame = self.frame(split)
        rows = frame[frame["unit"] == unit]
        if rows.empty:
            units = self.units(split)
            raise InputError(f"C-MAPSS {self.subset} {split}: no unit {unit!r}; units are {units}")
        return rows[["unit", "cycle", column]].reset_index(drop=True)

    def federation(
        self,
        sensor: str | int = "s2",
        split: str = "train",
        units: Sequence[int] | None = None,
        x_scale: float = 100.0,
        standardize: bool = True,
    ) -> Federation:
        """One client per engine: ``X = cycle / x_scale`` (n, 1) and ``y`` = the sensor.

        ``x_scale`` is one constant for all engines (no per-engine time normalisation: the shared
        prior needs a shared time axis). With ``standardize`` each engine's series is scaled to
        mean 0 and variance 1 (population std), as in the FGPR paper; the mean and std are kept in
        the client's ``metadata`` (``y_mean``, ``y_std``) with ``unit``, ``sensor`` and ``split``.
        """
        if not x_scale > 0:
            raise InputError(f"x_scale must be positive, got {x_scale}")
        column = _sensor_column(sensor)
        frame = self.frame(split)
        chosen = self.units(split) if units is None else [int(u) for u in units]
        groups = dict(tuple(frame.groupby("unit", sort=True)))
        clients = []
        for unit in chosen:
            if unit not in groups:
                raise InputError(f"C-MAPSS {self.subset} {split}: no unit {unit}")
            rows = groups[unit]
            y = rows[column].to_numpy(dtype=np.float64)
            mean, std = float(y.mean()), float(y.std())
            if std == 0.0:
                raise InputError(
                    f"C-MAPSS {self.subset} {split} unit {unit}: sensor {column} ({SENSOR_NAMES[column]}) "
                    f"is constant ({mean!r}); it carries no degradation signal. In FD001 sensors "
                    "s1, s5, s10, s16, s18 and s19 are constant."
                )
            if standardize:
                y = (y - mean) / std
            clients.append(
                ClientData(
                    rows["cycle"].to_numpy(dtype=np.float64)[:, None] / x_scale,
                    y,
                    id=unit,
                    metadata={
                        "unit": unit,
                        "subset": self.subset,
                        "split": split,
                        "sensor": column,
                        "x_scale": x_scale,
                        "y_mean": mean if standardize else 0.0,
                        "y_std": std if standardize else 1.0,
                    },
                )
            )
        return Federation(clients)

    def __repr__(self) -> str:
        return (
            f"CMAPSS({self.subset}: train {self.train.shape[0]} rows / {len(self.units('train'))} units, "
            f"test {self.test.shape[0]} rows / {len(self.units('test'))} units)"
        )


def load_cmapss(
    subset: str = "FD001",
    root: str | os.PathLike | None = None,
    download: bool = False,
    *,
    registry: DataRegistry | None = None,
    progress: bool | None = None,
    timeout: float = 60.0,
) -> CMAPSS:
    """Load and verify a C-MAPSS subset (``train_FDxxx.txt``, ``test_FDxxx.txt``, ``RUL_FDxxx.txt``).

    Files are read from ``<root>/cmapss/`` (root: ``root=``, else ``FEDGP_DATA``, else the
    repository's ``datasets/``); ``download=True`` fetches missing files from the registry's URLs
    (``timeout``: seconds to wait for the server).
    A missing, truncated or altered file raises :class:`~fedgp.datasets.registry.DataFileError`
    naming the file, where it was looked for and how to get it.
    """
    subset = str(subset).upper()
    if subset not in SUBSETS:
        raise InputError(f"unknown C-MAPSS subset {subset!r}; one of {', '.join(SUBSETS)}")
    registry = default_registry() if registry is None else registry
    paths, frames = {}, {}
    for split in ("train", "test"):
        name = f"{split}_{subset}.txt"
        paths[split] = locate("cmapss", name, root, download, registry, progress, timeout)
        frames[split] = _read_series_file(paths[split], registry.entry("cmapss", name))
    name = f"RUL_{subset}.txt"
    paths["rul"] = locate("cmapss", name, root, download, registry, progress, timeout)
    rul = _read_rul(paths["rul"], frames["test"]["unit"].nunique())
    return CMAPSS(subset, frames["train"], frames["test"], rul, paths)
