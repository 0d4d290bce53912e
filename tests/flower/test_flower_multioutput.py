"""A multi-output FGPR run on the in-process Flower engine (issue 52, item 1): the rows' output column
crosses Flower's wire format like any feature, the per-output transform's sums and the updates are
summed fields, so plain Flower gives the sequential engine's run, and secure aggregation and ClientDP
(noise at the server or from the clients) give it within the fixed-point encoding's bound."""

from __future__ import annotations

import os

import pytest
import torch

import fedgp
from fedgp.models import MultiOutputSpec, output_rows
from fedgp.transforms import Transforms

if os.environ.get("CI", "").strip().lower() == "true":
    import flwr  # noqa: F401  (fail, not skip, when CI lacks it)
else:
    pytest.importorskip("flwr")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fedgp.flower import Flower, SecureAggregation  # noqa: E402
from tests.models.test_multioutput import _correlated_owners  # noqa: E402

ROUNDS, NODES = 3, 2
QUIET = [fedgp.run.Progress(False)]


def _tolerance() -> float:
    """Each securely aggregated sum is within ``error_bound(NODES)`` (2.3e-10 at 32 fraction bits) of
    the float sum, per entry and round; the state after R rounds carries R such perturbations through
    local training (a few Adam steps, which do not amplify them tenfold here): R·10·bound = 7e-9.
    Measured: 2.7e-13 without DP, 9e-11 with it."""
    return ROUNDS * 10 * SecureAggregation().error_bound(NODES)


def _fit(strategy, engine, **options):
    spec = MultiOutputSpec(outputs=2, rank=1)
    return fedgp.fit(
        spec, _correlated_owners(), strategy, rounds=ROUNDS, engine=engine, seed=0, callbacks=QUIET, **options
    )


def test_multi_output_fgpr_on_flower_is_the_sequential_run(tmp_path):
    """Plain Flower: the same state to 1e-12 (bit for bit, measured), the same per-output transform and
    the same owner's predictions, also from the run saved and loaded (which the old code refused); with
    secure aggregation within the encoding's bound."""
    sequential = _fit(fedgp.strategies.FGPR(), "sequential")
    flower = _fit(fedgp.strategies.FGPR(), Flower(num_nodes=NODES))
    secure = _fit(fedgp.strategies.FGPR(), Flower(num_nodes=NODES, secure=SecureAggregation()))
    assert flower.state.allclose(sequential.state, rtol=1e-12, atol=0.0)
    assert torch.allclose(flower.transform.y_offset, sequential.transform.y_offset, rtol=1e-12, atol=0.0)
    assert flower.transform.y_offset.shape == (2,)  # one mean and sd per output
    rows = output_rows(torch.linspace(0, 1, 5, dtype=torch.float64)[:, None], 2)
    mean, _ = sequential.predict(rows, client=2)
    assert torch.allclose(flower.predict(rows, client=2)[0], mean, rtol=1e-12, atol=1e-12)
    loaded = fedgp.load(flower.save(tmp_path / "flower.fgp"))
    assert torch.allclose(loaded.predict(rows, client=flower.client_data(2))[0], mean, rtol=1e-12, atol=1e-12)
    assert secure.state.allclose(sequential.state, rtol=0.0, atol=_tolerance())
    assert torch.allclose(secure.transform.y_scale, sequential.transform.y_scale, rtol=0.0, atol=_tolerance())


@pytest.mark.parametrize(
    "where", [{}, {"noise_at": "clients", "noise_shares": 2}], ids=["server noise", "client noise"]
)
def test_client_dp_with_secure_aggregation_on_flower_is_the_sequential_run(where):
    """ClientDP (reproducible noise) over the multi-output update: on Flower with secure aggregation the
    same ε after every round and the same state within the encoding's bound."""
    pytest.importorskip("dp_accounting")
    private = fedgp.run.ClientDP(fedgp.strategies.FGPR(), epsilon=5.0, delta=1e-3, reproducible=True, **where)
    none = Transforms(outcome=None)  # ClientDP's "auto" standardises each owner: not for several outputs
    sequential = _fit(private, "sequential", transforms=none)
    secure = _fit(private, Flower(num_nodes=NODES, secure=SecureAggregation()), transforms=none)
    assert list(secure.history["epsilon"]) == list(sequential.history["epsilon"])
    assert float(sequential.history["epsilon"].iloc[-1]) > 0
    assert secure.state.allclose(sequential.state, rtol=0.0, atol=_tolerance())
    assert not secure.state.allclose(_fit(fedgp.strategies.FGPR(), "sequential", transforms=none).state)
