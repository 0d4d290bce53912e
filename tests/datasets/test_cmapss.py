"""C-MAPSS loader: the real files (via $FEDGP_DATA), and stand-ins in the same format for errors."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pandas as pd
import pytest

from fedgp.datasets import load_cmapss
from fedgp.datasets.cmapss import COLUMNS, SENSOR_NAMES
from fedgp.datasets.registry import DataRegistry
from fedgp.errors import DataFileError, DataFileMissing
from tests.datasets.real import require_real_data

FD001 = ("cmapss/train_FD001.txt", "cmapss/test_FD001.txt", "cmapss/RUL_FD001.txt")


def test_real_fd001_shapes_columns_and_units():
    root = require_real_data(*FD001)
    cm = load_cmapss("FD001", root=root)
    assert cm.train.shape == (20631, 26) and cm.test.shape == (13096, 26)
    assert list(cm.train.columns) == ["unit", "cycle", "op1", "op2", "op3", *[f"s{i}" for i in range(1, 22)]]
    assert len(cm.units("train")) == 100 and len(cm.units("test")) == 100 and cm.rul.shape == (100, 2)
    assert cm.train["unit"].dtype == np.int64 and cm.train.groupby("unit").size().min() == 128
    assert int(cm.rul["rul"].min()) == 7 and int(cm.rul["rul"].max()) == 145  # the documented RUL range
    assert SENSOR_NAMES["s2"] == "T24" and SENSOR_NAMES["s7"] == "P30"


@pytest.mark.parametrize("subset, units", [("FD002", 260), ("FD003", 100), ("FD004", 249)])
def test_real_other_subsets_load(subset, units):
    root = require_real_data(
        f"cmapss/train_{subset}.txt", f"cmapss/test_{subset}.txt", f"cmapss/RUL_{subset}.txt"
    )
    assert len(load_cmapss(subset, root=root).units("train")) == units


def test_real_federation_one_client_per_engine_standardised():
    cm = load_cmapss("FD001", root=require_real_data(*FD001))
    fed = cm.federation("s2")
    assert len(fed) == 100 and int(fed.sizes.sum()) == 20631 and fed.n_features == 1
    c = fed.by_id(1)
    raw = cm.series(1, "s2")["s2"].to_numpy()
    assert np.allclose(c.y.numpy() * c.metadata["y_std"] + c.metadata["y_mean"], raw)
    assert abs(float(c.y.mean())) < 1e-12 and abs(float(c.y.std(unbiased=False)) - 1) < 1e-12
    assert np.allclose(c.X[:, 0].numpy(), np.arange(1, len(raw) + 1) / 100.0)  # one global time scale
    assert cm.federation("T24", units=[3, 1]).ids == [3, 1]  # sensor by name, units in the order asked
    with pytest.raises(ValueError, match=r"sensor s1 \(T2\) is constant"):
        cm.federation("s1")
    with pytest.raises(ValueError, match="unknown C-MAPSS sensor"):
        cm.federation("s22")


def _copy_fd001(tmp_path):
    root = require_real_data(*FD001)
    for name in FD001:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, tmp_path / name)
    return tmp_path / "cmapss" / "train_FD001.txt"


def test_truncated_real_copy_raises_the_documented_error(tmp_path):
    path = _copy_fd001(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFileError) as info:
        load_cmapss("FD001", root=tmp_path)
    msg = str(info.value)
    assert info.value.reason == "size" and "truncated" in msg and str(path) in msg
    assert "download=True" in msg and "raw.githubusercontent.com" in msg and "root= argument" in msg


def test_altered_real_copy_raises_the_documented_error(tmp_path):
    path = _copy_fd001(tmp_path)
    data = bytearray(path.read_bytes())
    data[100] = ord("9") if data[100] != ord("9") else ord("8")  # one digit changed, same size
    path.write_bytes(bytes(data))
    with pytest.raises(DataFileError) as info:
        load_cmapss("FD001", root=tmp_path)
    assert info.value.reason == "checksum" and "sha256" in str(info.value) and str(path) in str(info.value)


def test_missing_file_names_it_and_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGP_DATA", str(tmp_path))
    with pytest.raises(DataFileMissing) as info:
        load_cmapss("FD001")
    assert str(tmp_path / "cmapss" / "train_FD001.txt") in str(info.value)
    assert f"FEDGP_DATA={tmp_path}" in str(info.value)


def test_download_from_a_local_mirror_of_the_real_files(tmp_path, http_root, monkeypatch):
    real = require_real_data(*FD001)
    served, base = http_root
    for name in FD001:
        (served / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real / name, served / name)
    monkeypatch.setenv("FEDGP_DATA_MIRROR", base)
    cm = load_cmapss("FD001", root=tmp_path / "fresh", download=True, progress=False)
    assert cm.train.shape == (20631, 26)
    assert (tmp_path / "fresh" / "cmapss" / "RUL_FD001.txt").read_bytes() == (real / FD001[2]).read_bytes()


# -- stand-ins in the documented format, with their own registry --------------------------------------


def _standin(tmp_path, rows: list[list[float]], test_rows=None, rul=(5, 7)) -> DataRegistry:
    folder = tmp_path / "cmapss"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}

    def write(name, lines):
        text = "".join(" ".join(f"{v:g}" for v in line) + "  \n" for line in lines)  # NASA's trailing spaces
        (folder / name).write_text(text)
        data = text.encode()
        files[name] = {
            "url": f"http://127.0.0.1:9/{name}",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    write("train_FD001.txt", rows)
    write("test_FD001.txt", rows if test_rows is None else test_rows)
    write("RUL_FD001.txt", [[r] for r in rul])
    return DataRegistry({"datasets": {"cmapss": {"title": "C-MAPSS", "folder": "cmapss", "files": files}}})


def _rows(units=(1, 2), cycles=4, width=26):
    rng = np.random.default_rng(0)
    return [[u, c, *rng.normal(size=width - 2).round(4)] for u in units for c in range(1, cycles + 1)]


def test_standin_in_the_real_format_parses(tmp_path):
    registry = _standin(tmp_path, _rows())
    cm = load_cmapss("FD001", root=tmp_path, registry=registry)
    assert cm.train.shape == (8, 26) and list(cm.train.columns) == list(COLUMNS)
    assert cm.units() == [1, 2] and list(cm.rul["rul"]) == [5, 7]
    assert len(cm.federation("s3")) == 2


@pytest.mark.parametrize(
    "rows, message",
    [
        ([r[:25] for r in _rows()], "25 columns, expected 26"),
        ([[r[0], r[1] + (r[1] == 3), *r[2:]] for r in _rows()], "cycle 4 on line 3, expected 3"),
        ([[2.5, *r[1:]] if i == 0 else r for i, r in enumerate(_rows())], "non-integers"),
    ],
)
def test_malformed_standins_raise_naming_the_file(tmp_path, rows, message):
    registry = _standin(tmp_path, rows)
    with pytest.raises(DataFileError, match=message) as info:
        load_cmapss("FD001", root=tmp_path, registry=registry)
    assert "train_FD001.txt" in str(info.value)


def test_rul_rows_must_match_test_units(tmp_path):
    registry = _standin(tmp_path, _rows(), rul=(5,))
    with pytest.raises(DataFileError, match=r"RUL_FD001.txt: shape \(1, 1\), expected \(2, 1\)"):
        load_cmapss("FD001", root=tmp_path, registry=registry)


def test_unknown_subset():
    with pytest.raises(ValueError, match="unknown C-MAPSS subset"):
        load_cmapss("FD009")


def test_frames_are_plain_pandas(tmp_path):
    cm = load_cmapss("FD001", root=tmp_path, registry=_standin(tmp_path, _rows()))
    assert isinstance(cm.train, pd.DataFrame) and isinstance(cm.series(2, 5), pd.DataFrame)
