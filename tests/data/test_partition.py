import numpy as np
import pytest

from fedgp.data import (
    ContinuousPartitioner,
    Federation,
    IidPartitioner,
    NaturalIdPartitioner,
    SizeSkewedPartitioner,
    skewed_sizes,
)


def assert_disjoint_cover(parts, n, complete=True):
    allrows = np.concatenate(parts)
    assert len(np.unique(allrows)) == len(allrows), "a row was given to two clients"
    if complete:
        assert np.array_equal(np.sort(allrows), np.arange(n))


def test_iid_covers_every_row_once():
    parts = IidPartitioner(7, seed=1)(100)
    assert_disjoint_cover(parts, 100)
    assert {len(p) for p in parts} <= {14, 15}


def test_size_skewed_sizes_span_the_range():
    sizes = skewed_sizes(2000, 10, 10_000, "loguniform", seed=0)
    assert sizes.min() >= 10 and sizes.max() <= 10_000
    # log-uniform: about a third of the clients in each decade
    decades = np.histogram(np.log10(sizes), bins=[1, 2, 3, 4.01])[0] / len(sizes)
    assert np.all(np.abs(decades - 1 / 3) < 0.05)
    pareto = skewed_sizes(2000, 10, 10_000, "pareto", seed=0)
    assert np.median(pareto) < 30 and pareto.max() > 1000


def test_size_skewed_partition_is_disjoint_and_scaled_to_fit():
    p = SizeSkewedPartitioner(20, min_size=10, max_size=1000, seed=2)
    parts = p(3000)
    assert_disjoint_cover(parts, 3000, complete=False)
    assert min(len(x) for x in parts) >= 10 and sum(len(x) for x in parts) <= 3000
    with pytest.raises(ValueError, match="cannot give 20 clients of at least 10"):
        p(150)


def test_continuous_strictness_interpolates_between_iid_and_sorted():
    feature = np.random.default_rng(0).normal(size=1000)
    sorted_parts = ContinuousPartitioner(5, strictness=1.0)(feature)
    assert_disjoint_cover(sorted_parts, 1000)
    for a, b in zip(sorted_parts[:-1], sorted_parts[1:]):
        assert feature[a].max() <= feature[b].min()
    iid_parts = ContinuousPartitioner(5, strictness=0.0)(feature)
    means = [feature[p].mean() for p in iid_parts]
    assert np.ptp(means) < 0.4  # IID: client means all near 0
    assert np.ptp([feature[p].mean() for p in sorted_parts]) > 2.0


def test_natural_id_keeps_order_of_appearance():
    labels, parts = NaturalIdPartitioner()(np.array([3, 3, 1, 1, 1, 2]))
    assert labels == [3, 1, 2]
    assert [list(p) for p in parts] == [[0, 1], [2, 3, 4], [5]]


def test_natural_ids_from_a_pandas_column_of_strings():
    """An owner column read by pandas is an object array of str (no ``.item()``): one client per
    owner, labelled by the plain value, in order of first appearance."""
    import pandas as pd

    labels, parts = NaturalIdPartitioner()(pd.Series(["north", "south", "north", "east"]))
    assert labels == ["north", "south", "east"] and all(type(label) is str for label in labels)
    assert [p.tolist() for p in parts] == [[0, 2], [1], [3]]


def test_federation_from_partition():
    X = np.random.default_rng(0).normal(size=(40, 3))
    y = X.sum(1)
    fed = Federation.from_partition(X, y, IidPartitioner(4)(40), ids=list("abcd"))
    assert fed.ids == list("abcd") and int(fed.sizes.sum()) == 40


def test_from_partition_checks_the_chosen_rows_once_and_names_the_client_that_fails():
    """The rows of every part are checked in one pass (10⁶ owners), with the errors of the
    one-by-one path: the first bad client named; a bad row that no part takes is not the data."""
    import torch

    from fedgp.data import ClientData
    from fedgp.errors import InputError

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(12, 2)), rng.normal(size=12)
    parts = [np.arange(0, 4), np.arange(4, 8), np.arange(8, 11)]
    fed = Federation.from_partition(X, y, parts, ids=["a", "b", "c"])
    for client, rows in zip(fed, parts):
        alone = ClientData(X[rows], y[rows], id=client.id)
        assert torch.equal(client.X, alone.X) and torch.equal(client.y, alone.y)
        assert client.metadata == {} and client.X_test is None and client.noise is None
    X[11, 0] = np.nan  # a row no part takes
    assert len(Federation.from_partition(X, y, parts, ids=["a", "b", "c"])) == 3
    X[5, 1] = np.inf
    with pytest.raises(
        InputError, match=r"client 'b': X contains 1 non-finite value\(s\) \(inf\), first at row 1"
    ):
        Federation.from_partition(X, y, parts, ids=["a", "b", "c"])
    y[8:11] = 2.5
    X[5, 1] = 0.0
    with pytest.raises(InputError, match=r"client 'c': y is constant"):
        Federation.from_partition(X, y, parts, ids=["a", "b", "c"])
    y[:12] = 1e151 * rng.normal(size=12)
    with pytest.raises(InputError, match=r"client 'a': y has values up to"):
        Federation.from_partition(X, y, parts, ids=["a", "b", "c"])
