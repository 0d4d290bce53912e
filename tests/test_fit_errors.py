"""Every user mistake the GP researcher hit (issue 16) is a ValueError/TypeError naming the client,
argument or field, and the fix."""

import dataclasses
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp
from fedgp.data import ClientData
from fedgp.errors import UnknownClientError
from fedgp.strategies import FGPR


@pytest.fixture(scope="module")
def draws():
    return fedgp.synthetic.gp_federation(num_clients=3, n=15, d=2, seed=0)


@pytest.fixture(scope="module")
def result(draws):
    return fedgp.fit(draws.spec, draws.federation, FGPR(local_steps=1), rounds=1)


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
def test_unknown_engine_option_is_refused_by_the_engines_config(engine, extra):
    if extra:
        pytest.importorskip(extra)
    config = type(fedgp.engines.engine_config(engine))  # the config fit(engine="...") uses
    assert config.name == engine
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bogus'"):
        config(bogus=1)
    assert "timeout" in [f.name for f in dataclasses.fields(config)]  # the valid keys are its fields


def test_an_unknown_engine_name_or_a_wrong_engine_type_is_a_clear_error(draws):
    with pytest.raises(
        ValueError,
        match=r"unknown engine 'warp'; available: auto, sequential, batched, ray, flower, or a fedgp.engines "
        r"config",
    ):
        fedgp.fit(draws.spec, draws.federation, rounds=1, engine="warp")
    factory = lambda spec, clients, seed=0, *, chunk: None  # noqa: E731  (engine factories are gone)
    for wrong in (42, {"chunk_size": 3}, factory, fedgp.engines.SequentialEngine):
        message = (
            r"engine must be a name \('auto', 'sequential', 'batched', .*\), a fedgp.engines config such "
            r"as fedgp.engines.Batched\(device='cuda'\), or an Engine; got " + re.escape(type(wrong).__name__)
        )
        with pytest.raises(TypeError, match=message):
            fedgp.fit(draws.spec, draws.federation, rounds=1, engine=wrong)


def test_engine_configs_hold_their_engines_options_and_build_it_with_them(draws):
    from fedgp.engines import Batched, Ray, Sequential
    from fedgp.engines.batched import BatchedEngine
    from fedgp.engines.sequential import SequentialEngine

    assert [f.name for f in dataclasses.fields(Sequential)] == ["loopback", "timeout"]
    assert [f.name for f in dataclasses.fields(Batched)] == [
        "device",
        "chunk_size",
        "minibatch_dtype",
        "compiled",
        "fused",
        "memory_mb",
        "check",
        "loopback",
        "timeout",
    ]
    keys = torch.tensor([7, 8, 9])  # the clients' global positions, for a shard of a larger federation
    seq = Sequential(loopback=True, timeout=5.0).build(draws.spec, draws.federation, seed=0, keys=keys)
    assert type(seq) is SequentialEngine
    assert (seq.loopback, seq.timeout, seq.keys.tolist()) == (True, 5.0, [7, 8, 9])
    bat = Batched(chunk_size=2, memory_mb=1.0, minibatch_dtype=torch.float32, loopback=True, timeout=5.0)
    built = bat.build(draws.spec, draws.federation, seed=0, keys=keys)
    assert type(built) is BatchedEngine
    assert (built.chunk_size, built.memory_mb, built.minibatch_dtype) == (2, 1.0, torch.float32)
    assert (built.loopback, built.timeout, built.keys.tolist()) == (True, 5.0, [7, 8, 9])
    with pytest.raises(ValueError, match="the Ray engine hosts a whole federation, not a shard of one"):
        Ray().build(draws.spec, draws.federation, seed=0, keys=keys)


def test_ray_has_its_own_options_and_its_shards_a_batched_config():
    from fedgp.engines import Batched, Ray, Sequential

    assert [f.name for f in dataclasses.fields(Ray)] == [
        "address",
        "num_workers",
        "threads",
        "timeout",
        "shard",
        "keep_alive",
    ]
    assert Ray().shard == Batched()
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'chunk_size'"):
        Ray(chunk_size=1)  # a shard's option: Ray(shard=Batched(chunk_size=1))
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'chunk'"):
        Ray(shard=Batched(chunk=1))
    with pytest.raises(
        TypeError, match=r"Ray\(shard=\.\.\.\) must be a fedgp.engines.Batched config, got Sequential"
    ):
        Ray(shard=Sequential())


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
