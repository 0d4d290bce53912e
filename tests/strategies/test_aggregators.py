"""Aggregators: closed forms, the default is today's FedAvg, and the median survives a liar."""

from dataclasses import dataclass

import gpytorch
import pytest
import torch

import fedgp
from fedgp import GPSpec, HyperState
from fedgp.aggregators import CoordinateMedian, WeightedMean
from fedgp.strategies import FGPR
from fedgp.strategies.fgpr import STATE
from fedgp.synthetic import gp_federation

SPEC = GPSpec(
    kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)),
    fixed=["likelihood.noise_covar.noise"],
)
OUT, LS, NOISE = (
    "covar_module.outputscale",
    "covar_module.base_kernel.lengthscale",
    "likelihood.noise_covar.noise",
)


def states(outputscales, lengthscales, noise):
    return HyperState(
        {
            OUT: torch.tensor(outputscales, dtype=torch.float64),
            LS: torch.tensor(lengthscales, dtype=torch.float64).reshape(-1, 1, 2),
            NOISE: torch.tensor(noise, dtype=torch.float64).reshape(-1, 1),
        },
        SPEC.event_shapes,
    )


PREVIOUS = states([1.0], [[1.0, 1.0]], [0.25]).index(0)
FOUR = states([1.0, 2.0, 4.0, 100.0], [[0.1, 1.0], [0.2, 2.0], [0.3, 3.0], [0.4, 50.0]], [9.0, 9.0, 9.0, 9.0])


def test_weighted_mean_is_sum_of_weighted_states_and_keeps_fixed_values():
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    out = WeightedMean()(SPEC, FOUR, w, PREVIOUS)
    assert float(out[OUT]) == pytest.approx(0.1 + 0.4 + 1.2 + 40.0)
    assert torch.allclose(out[LS], torch.tensor([[0.3, 21.4]], dtype=torch.float64))
    assert torch.equal(out[NOISE], PREVIOUS[NOISE])  # fixed: never averaged


def test_weighted_mean_in_raw_units_averages_gpytorchs_raw_parameters():
    w = torch.full((4,), 0.25, dtype=torch.float64)
    out = WeightedMean("raw")(SPEC, FOUR, w, PREVIOUS)
    raw = torch.log(torch.expm1(FOUR[OUT])).mean()  # softplus⁻¹, GPyTorch's Positive()
    assert float(out[OUT]) == pytest.approx(float(torch.nn.functional.softplus(raw)), rel=1e-12)


def test_coordinate_median_ignores_weights_and_outliers():
    w = torch.tensor([0.97, 0.01, 0.01, 0.01], dtype=torch.float64)
    out = CoordinateMedian("constrained")(SPEC, FOUR, w, PREVIOUS)
    assert float(out[OUT]) == pytest.approx(3.0)  # even count: mean of the middle two (2, 4)
    assert torch.allclose(out[LS], torch.tensor([[0.25, 2.5]], dtype=torch.float64))
    odd = FOUR.index(slice(0, 3))
    for space in ("constrained", "raw"):  # an odd median is a participant's value in either space
        got = CoordinateMedian(space)(SPEC, odd, w[:3], PREVIOUS)
        assert float(got[OUT]) == pytest.approx(2.0, rel=1e-12)
        assert torch.equal(got[NOISE], PREVIOUS[NOISE])


def test_default_aggregator_is_exactly_the_weighted_mean():
    draws = gp_federation(num_clients=5, n=30, d=2, seed=1)
    a = fedgp.fit(draws.spec, draws.federation, FGPR(batch_size=10), rounds=3)
    b = fedgp.fit(draws.spec, draws.federation, FGPR(batch_size=10, aggregator=WeightedMean("raw")), rounds=3)
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    with pytest.raises(ValueError, match="give the averaging space to the aggregator"):
        FGPR(average_space="raw", aggregator=CoordinateMedian())


@dataclass(frozen=True)
class Liar(FGPR):
    """FGPR whose client ``liar`` replies an outputscale of 1e6 every round."""

    liar: int = 0

    def local_update(self, ops, task):
        reply = super().local_update(ops, task)
        hit = (ops.indices == self.liar).reshape(-1, *([1] * (reply[STATE + OUT].dim() - 1)))
        reply[STATE + OUT] = torch.where(hit, 1e6, reply[STATE + OUT])
        return reply


def test_the_median_survives_a_lying_client_and_the_mean_does_not():
    draws = gp_federation(num_clients=7, n=60, d=1, seed=3, theta={OUT: 2.0, NOISE: 0.1})
    kwargs = dict(local_steps=3, batch_size=16, lr=0.05)
    mean = fedgp.fit(draws.spec, draws.federation, Liar.authors(**kwargs), rounds=20).state[OUT]
    median = fedgp.fit(
        draws.spec, draws.federation, Liar.authors(**kwargs, aggregator=CoordinateMedian()), rounds=20
    ).state[OUT]
    assert float(mean) > 1e4  # one liar of seven moves FedAvg wherever it likes
    # with the median the liar shifts each coordinate by at most one rank among seven: the learned
    # outputscale stays within a factor 1.5 of θ* = 2 (the honest FedAvg run is at 1.25 after 20 rounds)
    assert 2.0 / 1.5 < float(median) < 2.0 * 1.5
