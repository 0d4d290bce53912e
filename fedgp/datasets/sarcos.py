"""SARCOS robot-arm inverse dynamics (GPML data): 21 joint inputs, 7 torques, split into devices.

FGPR's SARCOS experiment (Yue & Kontar §7) partitions the 44,484 training and 4,449 test rows of
``sarcos_inv.mat`` / ``sarcos_inv_test.mat`` at random into 25 devices; each device conditions the
shared prior on its own training rows and is scored on its own test rows. When only the test file
is present (as on the project machines), the *reduced* protocol partitions the test file's rows
into devices and splits each device's rows into training and test; every federation and table
built from it says ``protocol="reduced"``. Nothing is ever synthesised in place of a missing file.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedgp.data.client import ClientData, Federation
from fedgp.data.partition import ContinuousPartitioner
from fedgp.datasets.registry import DataRegistry, FileEntry, data_root, default_registry, locate
from fedgp.errors import DataFileError, FedGPWarning, InputError
from fedgp.rng import generator

__all__ = ["SARCOS", "load_sarcos", "INPUTS", "OUTPUTS", "COLUMNS", "TRAIN_FILE", "TEST_FILE"]

#: SARCOS's training file (44,484 rows), as the dataset's site names it.
TRAIN_FILE = "sarcos_inv.mat"
#: SARCOS's test file (4,449 rows), as the dataset's site names it.
TEST_FILE = "sarcos_inv_test.mat"
#: Joint positions q1..q7, velocities dq1..dq7, accelerations ddq1..ddq7 (the 21 inputs).
INPUTS = tuple(f"{kind}{j}" for kind in ("q", "dq", "ddq") for j in range(1, 8))
#: Joint torques tau1..tau7 (the 7 outputs; the paper reports outputs 1, 3, 5 and 7).
OUTPUTS = tuple(f"tau{j}" for j in range(1, 8))
#: The 28 columns of both files, in file order: the 21 inputs, then the 7 outputs.
COLUMNS = INPUTS + OUTPUTS

Partition = str | Callable[..., list[np.ndarray]]


def _read_mat(path: Path, entry: FileEntry) -> pd.DataFrame:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    info = entry.info or {}
    variable = info.get("variable", path.stem)
    try:
        contents = loadmat(path)
    except (MatReadError, ValueError, OSError) as err:
        raise DataFileError(f"SARCOS file {path}: not a readable MAT-file: {err}", path=path) from err
    if variable not in contents:
        found = [k for k in contents if not k.startswith("__")]
        raise DataFileError(f"SARCOS file {path}: no variable {variable!r} (found {found})", path=path)
    array = np.asarray(contents[variable])
    shape = tuple(info.get("shape", (array.shape[0], len(COLUMNS))))
    if array.ndim != 2 or array.shape[1] != len(COLUMNS) or array.shape != shape:
        raise DataFileError(
            f"SARCOS file {path}: variable {variable!r} has shape {array.shape}, expected {shape} "
            f"(21 inputs + 7 torques per row)",
            path=path,
        )
    if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
        raise DataFileError(f"SARCOS file {path}: {variable!r} must hold finite floats", path=path)
    return pd.DataFrame(array.astype(np.float64), columns=list(COLUMNS))


def _output_column(output: int | str) -> str:
    if isinstance(output, (int, np.integer)) and not isinstance(output, bool):
        if not 1 <= int(output) <= 7:
            raise InputError(f"SARCOS output must be 1..7 (1-based, as in the paper), got {output}")
        return f"tau{int(output)}"
    if output in OUTPUTS:
        return str(output)
    raise InputError(f"unknown SARCOS output {output!r}; use 1..7 or tau1..tau7")


def _partition(partition: Partition, num_devices: int, n: int, seed: int, stream: str) -> list[np.ndarray]:
    """Row indices per device: ``"iid"`` (random), ``"contiguous"`` (consecutive blocks) or a
    partitioner (a ``ContinuousPartitioner`` is applied to the row index; others to ``n``)."""
    if partition == "iid":
        perm = generator(seed, stream).permutation(n)
        return [np.sort(p) for p in np.array_split(perm, num_devices)]
    if partition == "contiguous":
        return ContinuousPartitioner(num_devices, strictness=1.0)(np.arange(n))
    if isinstance(partition, ContinuousPartitioner):
        return partition(np.arange(n))
    if callable(partition):
        return [np.asarray(p, dtype=np.int64) for p in partition(n)]
    raise InputError(
        "partition must be 'iid', 'contiguous' or a partitioner such as IidPartitioner(25), "
        f"got {partition!r}"
    )


def partition_name(partition: Partition) -> str:
    if isinstance(partition, str):
        return partition
    return type(partition).__name__


@dataclass(frozen=True)
class SARCOS:
    """The verified SARCOS files: ``test`` (always), ``train`` (``None`` in the reduced protocol).

    Frames have columns :data:`COLUMNS` (``q1..q7``, ``dq1..dq7``, ``ddq1..ddq7``, ``tau1..tau7``).
    ``protocol`` is ``"paper"`` when both files are used and ``"reduced"`` otherwise.
    """

    test: pd.DataFrame
    train: pd.DataFrame | None
    protocol: str
    paths: dict[str, Path] = field(default_factory=dict)

    def federation(
        self,
        output: int | str = 1,
        partition: Partition = "iid",
        num_devices: int = 25,
        test_fraction: float = 0.1,
        seed: int = 0,
        standardize_inputs: bool = True,
        standardize_y: str = "device",
    ) -> Federation:
        """Devices with their own training and test rows, for one torque.

        Paper protocol: the training file's rows and the test file's rows are each partitioned
        (``"iid"``: at random, the paper's; ``"contiguous"``: consecutive blocks of the training
        file, a non-IID split, with each test row given to the device holding its nearest training
        input; a device that owns no test row then has no test split). Reduced protocol: the test
        file's rows are partitioned, then each device's rows are split at random into training
        and ``test_fraction`` test rows.

        Inputs are standardised with the pooled training rows' mean and std (one shared affine
        map); ``standardize_y`` is ``"device"`` (each device's own training mean/std: no statistic
        leaves a device), ``"global"`` (pooled training rows) or ``"none"``. Each client's metadata
        records ``device``, ``protocol``, ``partition``, ``output``, ``y_mean``, ``y_std``, ``x_mean``,
        ``x_std`` and the source rows (``train_rows``, ``test_rows`` in ``train_file``/``test_file``).
        """
        column = _output_column(output)
        if standardize_y not in ("device", "global", "none"):
            raise InputError(f"standardize_y must be 'device', 'global' or 'none', got {standardize_y!r}")
        if not 0.0 < test_fraction < 1.0:
            raise InputError(f"test_fraction must be in (0, 1), got {test_fraction}")
        train_src, test_src, train_parts, test_parts, files = self._device_rows(
            partition, num_devices, test_fraction, seed
        )
        X_train_all = train_src[list(INPUTS)].to_numpy()
        pooled = np.concatenate(train_parts)
        x_mean = X_train_all[pooled].mean(axis=0) if standardize_inputs else np.zeros(len(INPUTS))
        x_std = X_train_all[pooled].std(axis=0) if standardize_inputs else np.ones(len(INPUTS))
        y_pool = train_src[column].to_numpy()[pooled]
        clients = []
        for k, (tr, te) in enumerate(zip(train_parts, test_parts)):
            if len(tr) < 2:
                raise InputError(f"device {k}: {len(tr)} training rows; a device needs at least 2")
            y_tr = train_src[column].to_numpy()[tr]
            y_mean, y_std = _y_scale(standardize_y, y_tr, y_pool)
            if y_std == 0.0:
                raise InputError(f"device {k}: output {column} is constant on its training rows")
            clients.append(
                ClientData(
                    (X_train_all[tr] - x_mean) / x_std,
                    (y_tr - y_mean) / y_std,
                    id=k,
                    # a device can own no test row (paper protocol, contiguous): it trains, is not scored
                    X_test=(test_src[list(INPUTS)].to_numpy()[te] - x_mean) / x_std if len(te) else None,
                    y_test=(test_src[column].to_numpy()[te] - y_mean) / y_std if len(te) else None,
                    metadata={
                        "device": k,
                        "protocol": self.protocol,
                        "partition": partition_name(partition),
                        "output": column,
                        "y_mean": y_mean,
                        "y_std": y_std,
                        "x_mean": x_mean,
                        "x_std": x_std,
                        "train_file": files[0],
                        "test_file": files[1],
                        "train_rows": tr,
                        "test_rows": te,
                    },
                )
            )
        return Federation(clients)

    def _device_rows(self, partition: Partition, num_devices: int, test_fraction: float, seed: int):
        """``(training source, test source, each device's training rows, its test rows, the two
        file names)`` under this protocol (see :meth:`federation`)."""
        if self.protocol == "paper":
            train_parts = _partition(partition, num_devices, len(self.train), seed, "sarcos-train-partition")
            if partition == "iid" or not isinstance(partition, str):
                test_parts = _partition(
                    "iid" if partition == "iid" else partition,
                    len(train_parts),
                    len(self.test),
                    seed,
                    "sarcos-test-partition",
                )
            else:
                test_parts = _nearest_device(self.train, self.test, train_parts)
            return self.train, self.test, train_parts, test_parts, (TRAIN_FILE, TEST_FILE)
        parts = _partition(partition, num_devices, len(self.test), seed, "sarcos-partition")
        train_parts, test_parts = [], []
        for k, rows in enumerate(parts):
            if len(rows) < 3:
                raise InputError(f"device {k}: {len(rows)} rows are too few to split into train and test")
            perm = generator(seed, "sarcos-split", k).permutation(rows)
            n_test = min(max(int(round(test_fraction * len(rows))), 1), len(rows) - 2)
            test_parts.append(np.sort(perm[:n_test]))
            train_parts.append(np.sort(perm[n_test:]))
        return self.test, self.test, train_parts, test_parts, (TEST_FILE, TEST_FILE)

    def __repr__(self) -> str:
        train = "absent" if self.train is None else f"{len(self.train)} rows"
        return f"SARCOS(protocol={self.protocol!r}, train {train}, test {len(self.test)} rows)"


def _y_scale(how: str, y_device: np.ndarray, y_pool: np.ndarray) -> tuple[float, float]:
    """A device's target ``(mean, std)``: its own (``"device"``), the pooled rows' (``"global"``) or
    none (``"none"``)."""
    if how == "device":
        return float(y_device.mean()), float(y_device.std())
    if how == "global":
        return float(y_pool.mean()), float(y_pool.std())
    return 0.0, 1.0


def _nearest_device(train: pd.DataFrame, test: pd.DataFrame, train_parts: Sequence[np.ndarray]) -> list:
    """Give each test row to the device whose training rows contain its nearest input."""
    X = train[list(INPUTS)].to_numpy()
    mean, std = X.mean(axis=0), X.std(axis=0)
    Z = (X - mean) / std
    owner = np.empty(len(X), dtype=np.int64)
    for k, rows in enumerate(train_parts):
        owner[rows] = k
    Zt = (test[list(INPUTS)].to_numpy() - mean) / std
    nearest = np.empty(len(Zt), dtype=np.int64)
    sq = (Z * Z).sum(1)
    for start in range(0, len(Zt), 512):
        block = Zt[start : start + 512]
        d = sq[None, :] - 2 * block @ Z.T
        nearest[start : start + 512] = d.argmin(axis=1)
    device = owner[nearest]
    return [np.flatnonzero(device == k) for k in range(len(train_parts))]


def load_sarcos(
    root: str | os.PathLike | None = None,
    download: bool = False,
    protocol: str = "auto",
    *,
    registry: DataRegistry | None = None,
    progress: bool | None = None,
    timeout: float = 60.0,
) -> SARCOS:
    """Load and verify SARCOS.

    ``protocol="auto"`` uses both files when ``sarcos_inv.mat`` is present (it is verified, and a
    corrupt copy is an error, never skipped) and otherwise the reduced protocol on
    ``sarcos_inv_test.mat`` alone, with a ``UserWarning``; ``"paper"`` requires both files;
    ``"reduced"`` uses the test file only. ``download=True`` fetches missing files (``timeout``:
    seconds to wait for the server).
    """
    if protocol not in ("auto", "paper", "reduced"):
        raise InputError(f"protocol must be 'auto', 'paper' or 'reduced', got {protocol!r}")
    registry = default_registry() if registry is None else registry
    paths = {"test": locate("sarcos", TEST_FILE, root, download, registry, progress, timeout)}
    test = _read_mat(paths["test"], registry.entry("sarcos", TEST_FILE))
    train = None
    if protocol != "reduced":
        base, _ = data_root(root)
        entry = registry.entry("sarcos", TRAIN_FILE)
        candidate = base / entry.folder / entry.name
        if protocol == "paper" or download or candidate.exists():
            paths["train"] = locate("sarcos", TRAIN_FILE, root, download, registry, progress, timeout)
            train = _read_mat(paths["train"], entry)
        else:
            warnings.warn(
                f"SARCOS training file not found at {candidate}: using the reduced protocol on "
                f"{TEST_FILE} alone (every output is labelled protocol='reduced'). For the paper's "
                f"protocol get {TRAIN_FILE} ({entry.url}; {entry.describe()}) or pass download=True.",
                FedGPWarning,
                stacklevel=2,
            )
    return SARCOS(test, train, "paper" if train is not None else "reduced", paths)
