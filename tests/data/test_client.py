import numpy as np
import pandas as pd
import pytest
import torch

from fedgp.data import ClientData, Federation


def make(n=10, d=2, seed=0, **kw):
    r = np.random.default_rng(seed)
    return ClientData(r.normal(size=(n, d)), r.normal(size=n), **kw)


def test_stores_float64_tensors_from_numpy_pandas_and_ints():
    c = ClientData(pd.DataFrame({"a": [1, 2, 3], "b": [0, 1, 0]}), pd.Series([1, 2, 4]), id="x")
    assert c.X.dtype == torch.float64 and c.y.dtype == torch.float64
    assert c.n == 3 and c.n_features == 2


@pytest.mark.parametrize(
    "X, y, message",
    [
        (
            np.array([[0.0], [np.nan], [2.0]]),
            np.array([1.0, 2.0, 3.0]),
            r"client 'bad': X contains 1 non-finite value\(s\) \(NaN\), first at row 1",
        ),
        (
            np.array([[0.0], [1.0], [2.0]]),
            np.array([1.0, np.inf, 3.0]),
            r"client 'bad': y contains 1 non-finite value\(s\) \(inf\), first at row 1",
        ),
        (
            np.array([0.0, 1.0, 2.0]),
            np.array([1.0, 2.0, 3.0]),
            r"client 'bad': X must be 2-D .*X\[:, None\]",
        ),
        (
            np.array([[0.0], [1.0], [2.0]]),
            np.array([[1.0], [2.0], [3.0]]),
            r"client 'bad': y must be 1-D .*y.ravel",
        ),
        (
            np.array([[0.0], [1.0], [2.0]]),
            np.array([1.0, 2.0]),
            r"client 'bad': X has 3 rows but y has 2",
        ),
        (
            np.array([[0.0], [1.0], [2.0]]),
            np.array([5.0, 5.0, 5.0]),
            r"client 'bad': y is constant",
        ),
        (
            np.array([["a"], ["b"]], dtype=object),
            np.array([1.0, 2.0]),
            r"client 'bad': X has dtype object",
        ),
        (
            np.array([[1 + 1j], [2.0]]),
            np.array([1.0, 2.0]),
            r"client 'bad': X has dtype complex128",
        ),
        (
            np.array([[True], [False]]),
            np.array([1.0, 2.0]),
            r"client 'bad': X has dtype bool",
        ),
        (np.zeros((3, 0)), np.array([1.0, 2.0, 3.0]), r"client 'bad': X has no features"),
    ],
)
def test_bad_input_names_client_and_problem(X, y, message):
    with pytest.raises(ValueError, match=message):
        ClientData(X, y, id="bad")


def test_bad_test_split_is_rejected():
    X, y = np.random.default_rng(0).normal(size=(5, 2)), np.arange(5.0)
    with pytest.raises(ValueError, match="client 7: give both X_test and y_test"):
        ClientData(X, y, id=7, X_test=X)
    with pytest.raises(ValueError, match="client 7: X_test has 3 features but X has 2"):
        ClientData(X, y, id=7, X_test=np.zeros((2, 3)), y_test=np.zeros(2))
    with pytest.raises(ValueError, match=r"client 7: y_test contains 1 non-finite"):
        ClientData(X, y, id=7, X_test=np.zeros((2, 2)), y_test=np.array([0.0, np.nan]))


def test_split_moves_points_without_loss():
    c = make(n=20, id="a")
    s = c.split(0.25, 0)
    assert s.n == 15 and s.X_test.shape == (5, 2)
    pooled = torch.cat([s.y, s.y_test]).sort().values
    assert torch.equal(pooled, c.y.sort().values)


def test_federation_weights_ids_and_errors():
    fed = Federation([make(n=10, id="a"), make(n=30, id="b", seed=1)])
    assert torch.allclose(fed.weights, torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert fed.by_id("b").n == 30 and fed.index_of("b") == 1
    assert list(fed.summary()["n"]) == [10, 30]
    with pytest.raises(ValueError, match="duplicate client id 'a'"):
        Federation([make(id="a"), make(id="a", seed=1)])
    with pytest.raises(ValueError, match="client 'b': 3 features, but client 'a' has 2"):
        Federation([make(id="a"), make(d=3, id="b")])
    with pytest.raises(ValueError, match="at least one client"):
        Federation([])


def test_federation_assigns_positional_ids_and_splits():
    fed = Federation([make(n=10), make(n=12, seed=1)])
    assert fed.ids == [0, 1]
    split = fed.split(0.2, seed=3)
    assert split.has_test and [c.n for c in split] == [8, 10]
    assert torch.equal(split[0].X, fed.split(0.2, seed=3)[0].X)


@pytest.mark.parametrize("n", [0, 1])
def test_small_clients_exist_for_prediction_but_not_for_training(n):
    """0- and 1-point clients are cold starts: valid ClientData, refused by a Federation by name."""
    small = ClientData(np.zeros((n, 2)), np.zeros(n), id="new")
    assert small.n == n and small.n_features == 2
    ok = ClientData(np.random.default_rng(0).normal(size=(3, 2)), [1.0, 2.0, 3.0], id="ok")
    message = rf"client 'new': {n} training point\(s\); training needs at least 2"
    with pytest.raises(ValueError, match=message):
        Federation([ok, small])
    with pytest.raises(ValueError, match="client 'bad'.*at least 2"):
        parts = [np.arange(3), np.array([3])]
        Federation.from_partition(np.zeros((4, 1)), np.arange(4.0), parts, ids=["a", "bad"])


def test_with_client_replaces_one_owner_and_checks_it():
    g = torch.Generator().manual_seed(0)
    clients = [ClientData(torch.rand(4, 2, generator=g), torch.rand(4, generator=g), id=i) for i in range(3)]
    fed = Federation(clients, feature_names=["a", "b"])
    grown = ClientData(torch.rand(6, 2, generator=g), torch.rand(6, generator=g), id=1)
    out = fed.with_client(1, grown)
    assert out.sizes.tolist() == [4, 6, 4] and fed.sizes.tolist() == [4, 4, 4]  # a copy
    assert out[0] is fed[0] and out[2] is fed[2] and out.index_of(1) == 1
    assert out[1].feature_names == ("a", "b") and torch.equal(out[1].X, grown.X)
    with pytest.raises(ValueError, match="position 1 holds client 1 of 2 features; got client 7 of 2"):
        fed.with_client(1, ClientData(grown.X, grown.y, id=7))
    with pytest.raises(ValueError, match="client 1"):
        fed.with_client(1, ClientData(grown.X[:1], grown.y[:1], id=1))  # too few rows to train on
