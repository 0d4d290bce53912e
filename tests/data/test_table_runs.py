"""The owner table at scale (issue 51, item 7): one copy of the rows sorted by owner, one slice per
owner (``Federation.from_runs``), no Python object per row. The clients are those the per-owner
index arrays built before (``Federation.from_partition`` over ``rows_by_owner``), bit for bit."""

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgp.data import Federation
from fedgp.data.table import owner_codes, read_owner_table, rows_by_owner
from fedgp.errors import InputError


def _same(a: Federation, b: Federation) -> None:
    assert a.ids == b.ids and a.feature_names == b.feature_names
    for x, y in zip(a, b):
        assert torch.equal(x.X, y.X) and torch.equal(x.y, y.y) and x.X.dtype == y.X.dtype == torch.float64


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "007", "7", "NA", "z z"]), min_size=2, max_size=40),
    st.integers(0, 2**32 - 1),
)
def test_the_table_gives_the_clients_the_index_arrays_gave(tmp_path_factory, labels, seed):
    labels = labels + labels  # every owner at least twice
    rng = np.random.default_rng(seed)
    n = len(labels)
    frame = pd.DataFrame({"x1": rng.normal(size=n), "x2": rng.uniform(-1e3, 1e3, n), "y": rng.normal(size=n),
                          "owner": labels})  # fmt: skip
    path = tmp_path_factory.mktemp("t") / "t.csv"
    frame.to_csv(path, index=False)
    table = read_owner_table(path, group="owner", target="y")
    groups = rows_by_owner(table.owners)
    before = Federation.from_partition(
        table.X, table.y, list(groups.values()), ids=list(groups), feature_names=table.features
    )
    _same(table.federation(), before)
    assert table.federation().ids == list(dict.fromkeys(labels))  # first appearance, labels as written


def test_owner_codes_code_a_series_without_a_python_object_per_row():
    series = pd.Series(["b", "a", "b", "c"], dtype="str")
    codes, labels = owner_codes(series)
    assert codes.tolist() == [0, 1, 0, 2] and labels == ["b", "a", "c"]
    assert owner_codes(np.array([3, 1, 3]))[1] == [3, 1] and type(owner_codes([np.int64(3)])[1][0]) is int
    with pytest.raises(InputError, match="row 1 has no owner"):
        owner_codes(pd.Series(["a", None]))


def test_from_runs_is_from_partition_over_contiguous_ranges():
    rng = np.random.default_rng(0)
    X, y, sizes = rng.normal(size=(9, 2)), rng.normal(size=9), [2, 0, 4, 3]
    bounds = np.cumsum([0, *sizes])
    parts = [np.arange(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    _same(
        Federation.from_runs(X, y, [2, 4, 3], ids=["p", "q", "r"]),
        Federation.from_partition(X, y, parts, ids=["p", "q", "r"]),
    )
    one = Federation.from_runs(X, y, [2, 4, 3])
    assert one.ids == [0, 1, 2]
    assert one[1].X.untyped_storage().nbytes() == 4 * 2 * 8  # its own copy, not a view of the pool


def test_from_runs_refuses_by_client():
    X, y = np.zeros((4, 1)), np.array([0.0, 1.0, 2.0, 2.0])
    with pytest.raises(InputError, match="add up to 3 rows, but X has 4"):
        Federation.from_runs(X, y, [1, 2])
    with pytest.raises(InputError, match="2 sizes but 1 ids"):
        Federation.from_runs(X, y, [2, 2], ids=["a"])
    with pytest.raises(InputError, match="non-negative integers"):
        Federation.from_runs(X, y, [5, -1])
    with pytest.raises(InputError, match=r"client 'b': y is constant \(2.0 at all 2 points\)"):
        Federation.from_runs(X, y, [2, 2], ids=["a", "b"])
    with pytest.raises(InputError, match="client 'b'.*(nan|NaN|finite)"):
        Federation.from_runs(X, np.array([0.0, 1.0, np.nan, 2.0]), [2, 2], ids=["a", "b"])
    with pytest.raises(InputError, match="client 'a': 1 training point"):
        Federation.from_runs(X, y, [1, 3], ids=["a", "b"])
