"""A reply outside what its field declares is that client's failure for the round, with the reason:
never an abort of the run and never part of an average. A state declares each hyper-parameter's
domain from its GPyTorch constraint (within ±1e150)."""

import gpytorch
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.messages import Record
from fedgp.messages.round import STATE_MAGNITUDE, Field, check_reply, param_domain, state_fields
from fedgp.strategies import fgpr

SPEC = fedgp.GPSpec(
    gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(lengthscale_constraint=gpytorch.constraints.Interval(0.01, 10.0))
    ),
    mean=gpytorch.means.ConstantMean(),
)


def test_a_state_declares_its_constraints_as_domains():
    fields = state_fields(SPEC, "state/")
    domains = {name: field.domain for name, field in fields.items()}
    noise = domains["state/likelihood.noise_covar.noise"]
    assert noise == pytest.approx((1e-4, STATE_MAGNITUDE))  # GreaterThan(1e-4)
    assert domains["state/covar_module.outputscale"] == pytest.approx((0.0, STATE_MAGNITUDE))  # Positive
    assert domains["state/covar_module.base_kernel.lengthscale"] == pytest.approx((0.01, 10.0))
    # sums, differences and gradients have no domain of their own
    assert all(f.domain is None for f in state_fields(SPEC, "update/", summed=True).values())
    assert all(f.domain is None for f in state_fields(SPEC, "grad/").values())
    raw_constant = {p.name: param_domain(p) for p in SPEC.params}["mean_module.raw_constant"]
    assert raw_constant == pytest.approx((-STATE_MAGNITUDE, STATE_MAGNITUDE))


def test_a_positive_hyper_parameter_is_at_least_1e_minus_150():
    """A lengthscale or scale of 0 (or 1e-300) divides the inputs by zero: a posterior of NaN."""
    field = state_fields(SPEC, "state/")["state/covar_module.outputscale"]
    values = torch.tensor([0.0, 1e-300, 1e-150, 1.0], dtype=torch.float64)
    reasons = check_reply(Record({"v": values}), {"v": field}, 4)
    assert [r is None for r in reasons] == [False, False, True, True]
    assert reasons[0] == "field 'v' is 0, outside its domain [1e-150, 1e+150]"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e300, max_value=1e300),
        min_size=1,
        max_size=6,
    )
)
def test_exactly_the_rows_outside_the_domain_fail(values):
    field = Field((), torch.float64, domain=(1e-4, 1e150))
    reasons = check_reply(Record({"v": torch.tensor(values, dtype=torch.float64)}), {"v": field}, len(values))
    for value, reason in zip(values, reasons):
        if 1e-4 <= value <= 1e150:
            assert reason is None
        else:
            assert reason == f"field 'v' is {value:.4g}, outside its domain [0.0001, 1e+150]"


@pytest.fixture
def hostile_client(monkeypatch):
    """Client 3 of every round replies ``value`` for ``name``, whatever it trained."""
    honest = fgpr.FGPR.local_update

    def install(name: str, value: float) -> None:
        def local_update(self, ops, task):
            reply = honest(self, ops, task)
            key = f"state/{name}"
            reply[key] = reply[key].clone()
            for row, index in enumerate(torch.as_tensor(ops.indices).tolist()):
                if index == 3:
                    reply[key][row] = value
            return reply

        monkeypatch.setattr(fgpr.FGPR, "local_update", local_update)

    return install


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize("aggregator", [None, fedgp.aggregators.CoordinateMedian()])
@pytest.mark.parametrize(
    "name, value",
    [("likelihood.noise_covar.noise", -1000.0), ("covar_module.outputscale", 1e300)],
)
def test_a_reply_outside_its_domain_fails_that_client_not_the_run(
    hostile_client, engine, aggregator, name, value
):
    draws = fedgp.synthetic.gp_federation(num_clients=8, n=40, d=2, n_test=10, seed=0)
    strategy = fgpr.FGPR() if aggregator is None else fgpr.FGPR(aggregator=aggregator)
    clean = fedgp.fit(draws.spec, draws.federation, strategy, rounds=3, engine=engine, seed=0)
    hostile_client(name, value)
    result = fedgp.fit(draws.spec, draws.federation, strategy, rounds=3, engine=engine, seed=0)
    assert list(result.failures["client"]) == [3, 3, 3]
    assert result.failures["reason"].str.contains("outside its domain").all()
    assert (result.history["failed"] == 1).all()
    # never averaged in: the state stays in its domain and near the run without the liar's replies
    assert 1e-4 <= float(result.state["likelihood.noise_covar.noise"]) < 10
    assert float(result.state["covar_module.outputscale"]) < 100
    assert result.evaluate()["rmse"].mean() < 1.5 * clean.evaluate()["rmse"].mean()
