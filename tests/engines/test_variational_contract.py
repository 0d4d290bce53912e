"""The engine and strategy contracts with a sparse variational GP (fedgp.VariationalGPSpec): the
same replies and results on every in-process engine, records only on the wire."""

import dataclasses

import pytest

from fedgp import VariationalGPSpec
from fedgp.engines import Batched, Sequential
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation
from fedgp.testing import EngineContract
from fedgp.testing.strategy import StrategyContract


def variational_draws(num_clients: int, n: list[int], n_test: int, seed: int):
    """The contract's GP clients, modelled by an SVGP of 6 inducing points and the draws' kernel."""
    data = gp_federation(num_clients=num_clients, n=n, d=2, n_test=n_test, seed=seed)
    spec = VariationalGPSpec(6, data.spec.kernel, input_dim=2)
    return dataclasses.replace(data, spec=spec)


class VariationalData:
    @pytest.fixture(scope="class")
    @classmethod
    def gp(cls):
        """7 GP clients of unequal sizes with test splits, an SVGP of 6 inducing points."""
        return variational_draws(7, [12, 20, 9, 30, 16, 25, 14], 6, 4)


class TestSequentialVariationalContract(VariationalData, EngineContract):
    engine = Sequential()


class TestBatchedVariationalContract(VariationalData, EngineContract):
    engine = Batched(chunk_size=3)


class TestFGPRVariationalStrategyContract(StrategyContract):
    strategy = FGPR(local_steps=2, batch_size=8)
    expected_replies = {"state/*": "individual", "loss": "individual"}

    def make_data(self):
        data = variational_draws(5, [14, 20, 9, 17, 12], 5, 3)
        return data.spec, data.federation
