"""Every user mistake the GP researcher hit (issue 16) is a ValueError/TypeError naming the client,
argument or field, and the fix."""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp
from fedgp.data import ClientData
from fedgp.fit import UnknownClientError, engine_options
from fedgp.strategies import FGPR


@pytest.fixture(scope="module")
def draws():
    return fedgp.data.gp_federation(num_clients=3, n=15, d=2, seed=0)


@pytest.fixture(scope="module")
def result(draws):
    return fedgp.fit(draws.spec, draws.federation, FGPR(local_steps=1), rounds=1, progress=False)


def test_unknown_client_position_or_id_lists_the_valid_ones(result):
    X = torch.zeros(3, 2, dtype=torch.float64)
    with pytest.raises(
        ValueError, match=r"client=99: no client at that position.* 3 clients, positions 0..2"
    ):
        result.predict(X, client=99)
    with pytest.raises(ValueError, match=r"client=-1: no client at that position"):
        result.predict(X, client=-1)
    with pytest.raises(ValueError, match=r"no client with id 'nobody'.*ids 0, 1, 2.*ClientData"):
        result.predict(X, client="nobody")
    assert issubclass(UnknownClientError, KeyError)  # callers that caught KeyError still do


def test_new_client_with_wrong_feature_count_is_blamed_not_X(result):
    new = ClientData(np.random.default_rng(0).uniform(size=(5, 3)), np.arange(5.0), id="new")
    with pytest.raises(
        ValueError, match=r"client 'new' has 3 features, but the model was trained on 2-feature"
    ):
        result.predict(torch.zeros(3, 2, dtype=torch.float64), client=new)


def test_X_with_the_wrong_width_names_the_client_and_width(result):
    with pytest.raises(ValueError, match=r"X must have shape \(n, 2\) for client 0.*got \(3, 5\)"):
        result.predict(torch.zeros(3, 5), client=0)
    with pytest.raises(ValueError, match=r"X\[:, None\]"):
        result.predict(torch.zeros(3), client=0)
    with pytest.raises(ValueError, match=r"client 1: X contains 1 non-finite value\(s\) \(NaN\)"):
        result.predict([[0.0, float("nan")]], client=1)


@pytest.mark.parametrize(
    "engine, extra", [("sequential", None), ("batched", None), ("ray", "ray"), ("flower", "flwr")]
)
def test_unknown_engine_option_lists_the_valid_keys(draws, engine, extra):
    if extra:
        pytest.importorskip(extra)
    with pytest.raises(
        ValueError,
        match=rf"engine_options: unknown key\(s\) 'bogus' for engine '{engine}'; valid keys: .*timeout",
    ):
        fedgp.fit(draws.spec, draws.federation, rounds=1, engine=engine, engine_options={"bogus": 1})


def test_engine_option_names_follow_the_constructors():
    from fedgp.engines.batched import BatchedEngine
    from fedgp.engines.sequential import SequentialEngine

    assert engine_options(SequentialEngine) == ["loopback", "timeout", "keys"]
    assert engine_options(BatchedEngine)[:5] == [
        "chunk_size",
        "memory_mb",
        "check",
        "minibatch_dtype",
        "compiled",
    ]
    assert "loopback" in engine_options(BatchedEngine)
    assert engine_options(lambda spec, clients, seed=0, *, chunk: None) == ["chunk"]  # a factory


def test_ray_lists_its_own_options_and_its_shards(draws):
    pytest.importorskip("ray")
    with pytest.raises(ValueError, match=r"valid keys: address, num_workers, threads, timeout, chunk_size"):
        fedgp.fit(draws.spec, draws.federation, rounds=1, engine="ray", engine_options={"chunk": 1})


def test_spec_and_strategy_must_be_the_right_objects(draws):
    with pytest.raises(TypeError, match=r"spec must be a fedgp.GPSpec .* got NoneType"):
        fedgp.fit(None, draws.federation, rounds=1)
    with pytest.raises(TypeError, match=r"strategy must be a fedgp.strategies.Strategy .* got str"):
        fedgp.fit(draws.spec, draws.federation, "fgpr", rounds=1)


def test_evaluate_without_test_splits_has_the_documented_columns(result):
    frame = result.evaluate()
    assert frame.empty
    assert list(frame.columns) == ["client", "n_test", "rmse", "nll", "coverage95", "cluster"]


def test_predict_from_pandas_is_silent_and_equals_numpy(result):
    frame = pd.DataFrame(np.random.default_rng(1).uniform(size=(4, 2)), columns=["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's non-writable-array warning would fail here
        mean, var = result.predict(frame, client=0)
    mean_np, var_np = result.predict(frame.to_numpy(), client=0)
    assert torch.equal(mean, mean_np) and torch.equal(var, var_np)
