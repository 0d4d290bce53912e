"""SARCOS loader: the real test file (via $FEDGP_DATA), the reduced and the paper protocols."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
from scipy.io import savemat

from fedgp.data import IidPartitioner
from fedgp.datasets import load_sarcos
from fedgp.datasets.registry import DataRegistry
from fedgp.datasets.sarcos import COLUMNS
from fedgp.errors import DataFileError, DataFileMissing
from tests.datasets.real import require_real_data

TEST_FILE = "sarcos/sarcos_inv_test.mat"


def _reduced(root):
    with pytest.warns(UserWarning, match="reduced protocol"):
        return load_sarcos(root=root)


def test_real_test_file_shape_columns_and_protocol():
    data = _reduced(require_real_data(TEST_FILE))
    assert data.protocol == "reduced" and data.train is None
    assert data.test.shape == (4449, 28) and list(data.test.columns) == list(COLUMNS)
    assert list(data.test.columns[:3]) == ["q1", "q2", "q3"] and list(data.test.columns[-7:]) == [
        f"tau{j}" for j in range(1, 8)
    ]
    assert not data.test.duplicated().any()  # documented: 4449 distinct rows


@pytest.mark.parametrize("partition", ["iid", "contiguous"])
def test_reduced_protocol_devices_split_every_row_once(partition):
    data = _reduced(require_real_data(TEST_FILE))
    fed = data.federation(output=3, partition=partition, seed=1)
    assert len(fed) == 25
    train = np.concatenate([c.metadata["train_rows"] for c in fed])
    test = np.concatenate([c.metadata["test_rows"] for c in fed])
    rows = np.concatenate([train, test])
    assert len(rows) == 4449 and len(np.unique(rows)) == 4449  # every row in exactly one place
    sizes = np.array([c.n + len(c.y_test) for c in fed])
    assert sizes.min() >= 177 and sizes.max() <= 178
    assert {c.n for c in fed} <= {159, 160} and {len(c.y_test) for c in fed} == {18}
    assert all(c.metadata["protocol"] == "reduced" and c.metadata["partition"] == partition for c in fed)
    # each device's torque is standardised on its own training rows; test rows share that scale
    c = fed[4]
    raw = data.test["tau3"].to_numpy()
    assert np.allclose(
        c.y.numpy() * c.metadata["y_std"] + c.metadata["y_mean"], raw[c.metadata["train_rows"]]
    )
    assert np.allclose(
        c.y_test.numpy() * c.metadata["y_std"] + c.metadata["y_mean"], raw[c.metadata["test_rows"]]
    )
    if partition == "contiguous":
        blocks = [np.sort(np.r_[c.metadata["train_rows"], c.metadata["test_rows"]]) for c in fed]
        assert all(np.array_equal(b, np.arange(b[0], b[-1] + 1)) for b in blocks)
        assert [b[0] for b in blocks] == sorted(b[0] for b in blocks)


def test_reduced_protocol_is_seeded_and_accepts_a_partitioner():
    data = _reduced(require_real_data(TEST_FILE))
    a, b = data.federation(1, seed=3), data.federation(1, seed=3)
    assert all(np.array_equal(x.metadata["test_rows"], y.metadata["test_rows"]) for x, y in zip(a, b))
    assert not np.array_equal(a[0].metadata["test_rows"], data.federation(1, seed=4)[0].metadata["test_rows"])
    fed = data.federation(7, partition=IidPartitioner(10, seed=0))
    assert len(fed) == 10 and fed[0].metadata["partition"] == "IidPartitioner"
    with pytest.raises(ValueError, match="output must be 1..7"):
        data.federation(8)


def test_paper_protocol_is_refused_without_the_training_file(tmp_path):
    real = require_real_data(TEST_FILE)
    (tmp_path / "sarcos").mkdir()
    shutil.copyfile(real / TEST_FILE, tmp_path / TEST_FILE)
    with pytest.raises(DataFileMissing) as info:
        load_sarcos(root=tmp_path, protocol="paper")
    msg = str(info.value)
    assert (
        "SARCOS file 'sarcos_inv.mat' not found" in msg and str(tmp_path / "sarcos" / "sarcos_inv.mat") in msg
    )
    assert "gaussianprocess.org" in msg and "687b7aaa5faf5a9c67fc6655fd59fd8b4539ad55" in msg


def test_truncated_real_test_file_is_an_error_not_a_fallback(tmp_path):
    real = require_real_data(TEST_FILE)
    (tmp_path / "sarcos").mkdir()
    data = (real / TEST_FILE).read_bytes()
    (tmp_path / TEST_FILE).write_bytes(data[:-1000])
    with pytest.raises(DataFileError, match="truncated") as info:
        load_sarcos(root=tmp_path)
    assert str(tmp_path / TEST_FILE) in str(info.value)


# -- stand-ins written as MAT v5 files, with their own registry ---------------------------------------


def _standin(tmp_path, n_train: int | None, n_test: int, train_bytes: bytes | None = None) -> DataRegistry:
    rng = np.random.default_rng(0)
    folder = tmp_path / "sarcos"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, var, n in (
        ("sarcos_inv.mat", "sarcos_inv", n_train),
        ("sarcos_inv_test.mat", "sarcos_inv_test", n_test),
    ):
        if n is None:
            files[name] = {
                "url": "http://127.0.0.1:9/x",
                "git_blob_sha1": "0" * 40,
                "variable": var,
                "shape": [1, 28],
            }
            continue
        X = rng.normal(size=(n, 21)).cumsum(axis=0) / 10  # trajectory-like: neighbouring rows are close
        y = np.c_[[np.sin(X[:, j]) + 0.1 * rng.normal(size=n) for j in range(7)]].T
        savemat(folder / name, {var: np.c_[X, y]})
        data = (folder / name).read_bytes()
        files[name] = {
            "url": f"http://127.0.0.1:9/{name}",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "variable": var,
            "shape": [n, 28],
        }
    return DataRegistry({"datasets": {"sarcos": {"title": "SARCOS", "folder": "sarcos", "files": files}}})


def test_paper_protocol_with_both_files(tmp_path):
    registry = _standin(tmp_path, 500, 100)
    data = load_sarcos(root=tmp_path, registry=registry)
    assert data.protocol == "paper" and data.train.shape == (500, 28) and data.test.shape == (100, 28)
    for partition in ("iid", "contiguous"):
        fed = data.federation(2, partition=partition, num_devices=5, seed=0)
        assert all(c.has_test for c in fed) or partition == "contiguous"  # nearest-device may leave one empty
        train = np.sort(np.concatenate([c.metadata["train_rows"] for c in fed]))
        test = np.sort(np.concatenate([c.metadata["test_rows"] for c in fed]))
        assert np.array_equal(train, np.arange(500)) and np.array_equal(test, np.arange(100))
        assert (
            fed[0].metadata["train_file"] == "sarcos_inv.mat"
            and fed[0].metadata["test_file"] == "sarcos_inv_test.mat"
        )
        assert all(c.metadata["protocol"] == "paper" for c in fed)
    # contiguous: training rows in blocks; each test row goes to the device of its nearest training input
    fed = data.federation(2, partition="contiguous", num_devices=5)
    Xtr, Xte = data.train.iloc[:, :21].to_numpy(), data.test.iloc[:, :21].to_numpy()
    mean, std = Xtr.mean(0), Xtr.std(0)
    Z, Zt = (Xtr - mean) / std, (Xte - mean) / std
    nearest = ((Zt[:, None, :] - Z[None]) ** 2).sum(-1).argmin(1)
    owner = np.concatenate([[k] * c.n for k, c in enumerate(fed)])
    for k, c in enumerate(fed):
        assert np.all(owner[nearest[c.metadata["test_rows"]]] == k)
    assert load_sarcos(root=tmp_path, registry=registry, protocol="reduced").protocol == "reduced"


def test_a_corrupt_training_file_is_never_skipped(tmp_path):
    registry = _standin(tmp_path, 200, 50)
    path = tmp_path / "sarcos" / "sarcos_inv.mat"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(DataFileError, match="sarcos_inv.mat") as info:
        load_sarcos(root=tmp_path, registry=registry)
    assert info.value.reason == "size"


def test_wrong_shape_in_a_verified_file_is_a_format_error(tmp_path):
    registry = _standin(tmp_path, None, 60)
    entry = registry.data["datasets"]["sarcos"]["files"]["sarcos_inv_test.mat"]
    entry["shape"] = [61, 28]
    with pytest.raises(DataFileError, match=r"shape \(60, 28\), expected \(61, 28\)"):
        load_sarcos(root=tmp_path, registry=DataRegistry(registry.data))
