"""Issue 53, item 3: a privacy budget for the whole federated BO loop (fedgp.bo.budget). The noise is
calibrated for the planned rounds, the history's ε is dp-accounting's for every round so far, the
loop never spends past the budget (it stops before the iteration that would), bad budgets are
refused naming what fits, and a resumed loop keeps what was spent."""

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgp import GPSpec
from fedgp.bo import Acquisition, BOCheckpoint, BOLoop, FederatedBO, Owner
from fedgp.bo.synthetic import shared_prior_owners
from fedgp.errors import InputError
from fedgp.run.privacy import ClientDP
from fedgp.strategies import FGPR

pytest.importorskip("botorch")
pytest.importorskip("dp_accounting")

ACQ = Acquisition("qucb", num_restarts=1, raw_samples=16)
TIMES = ["seconds_propose", "seconds_update"]


def owners(k: int = 3):
    return [
        Owner(o.id, o.truth, o.bounds, truth=o.truth, optimum=o.optimum)
        for o in shared_prior_owners(k, dim=1, lengthscale=0.2, seed=4)
    ]


def method(privacy: ClientDP, rounds: int = 2, initial_rounds: int = 3) -> FederatedBO:
    return FederatedBO(
        GPSpec(), privacy, rounds=rounds, initial_rounds=initial_rounds, engine="sequential", acquisition=ACQ
    )


def dp_accountings_epsilon(noise: float, rate: float, rounds: int, delta: float) -> float:
    """The library's own answer, not fedgp's: the sampled Gaussian mechanism, composed."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    event = dp_accounting.GaussianDpEvent(noise)
    if rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(rate, event)
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_a_budget_calibrates_the_noise_for_the_planned_loop_and_reports_dp_accountings_epsilon(rate):
    privacy = ClientDP(FGPR(), epsilon=3.0, delta=1e-5, rate=rate, reproducible=True)
    result = BOLoop(owners(), method(privacy), 3, seed=0).run()
    assert result.stop_reason is None and result.history["iteration"].max() == 3
    noise = result.method.budget.noise
    assert noise == result.method.result.history.attrs["privacy"]["noise"]
    per_iteration = result.history.groupby("iteration")
    assert (per_iteration["epsilon"].nunique() == 1).all()  # every owner's ε: the same rounds
    rounds = per_iteration["round"].first().tolist()
    assert rounds == [3, 5, 7, 9]  # 3 initial, then 2 per iteration: the planned 9
    for n, epsilon in zip(rounds, per_iteration["epsilon"].first()):
        assert epsilon == pytest.approx(dp_accountings_epsilon(noise, rate, n, 1e-5), rel=1e-9)
    final = per_iteration["epsilon"].first().iloc[-1]
    assert 2.99 < final <= 3.0  # the planned rounds spend the budget, never more
    # ... and a smaller noise multiplier would not have fitted: the calibration is the smallest
    assert dp_accountings_epsilon(noise * 0.99, rate, 9, 1e-5) > 3.0


def test_a_given_noise_stops_the_loop_before_the_iteration_that_would_pass_the_budget():
    z, rate = 2.0, 1.0
    budget = dp_accountings_epsilon(z, rate, 3 + 2 * 2, 1e-5) * 1.0001  # the start and 2 iterations
    privacy = ClientDP(FGPR(), epsilon=budget, noise=z, delta=1e-5, rate=rate, reproducible=True)
    loop = BOLoop(owners(), method(privacy), 6, seed=0)
    result = loop.run()
    assert result.history["iteration"].max() == 2
    assert result.stop_reason.startswith("privacy budget: iteration 3's 2 rounds would spend ε = ")
    assert result.history["epsilon"].max() <= budget
    with pytest.raises(InputError, match="the loop is done .privacy budget"):
        loop.step()  # no way round it


@settings(max_examples=6, deadline=None)
@given(
    noise=st.floats(0.8, 4.0),
    rate=st.sampled_from([1.0, 0.5]),
    epsilon=st.floats(0.5, 12.0),
    rounds=st.integers(1, 3),
    iterations=st.integers(1, 4),
)
def test_the_loop_never_spends_past_its_budget(noise, rate, epsilon, rounds, iterations):
    privacy = ClientDP(FGPR(), epsilon=epsilon, noise=noise, delta=1e-5, rate=rate, reproducible=True)
    loop = BOLoop(owners(), method(privacy, rounds=rounds, initial_rounds=2), iterations, seed=1)
    first = dp_accountings_epsilon(noise, rate, 2 + rounds, 1e-5)
    if first > epsilon:
        with pytest.raises(InputError, match="does not afford the start's 2 rounds and one iteration's"):
            loop.run()
        return
    result = loop.run()
    spent = result.history.groupby("iteration")["epsilon"].first()
    assert (spent <= epsilon).all()
    done = int(result.history["round"].max())
    if result.stop_reason is None:
        assert len(spent) == iterations + 1
    else:  # stopped only because the next iteration would have passed it
        assert dp_accountings_epsilon(noise, rate, done + rounds, 1e-5) > epsilon


def test_bad_budgets_are_refused_with_what_would_fit():
    with pytest.raises(InputError, match=r"does not afford .* fit at noise=\d"):
        BOLoop(owners(), method(ClientDP(FGPR(), epsilon=0.5, noise=0.5)), 3).run()
    with pytest.raises(InputError, match=r"delta=0.5\) must be below 1/K = 0.333"):
        BOLoop(owners(), method(ClientDP(FGPR(), epsilon=1.0, delta=0.5)), 3).run()
    with pytest.raises(InputError, match="epsilon=.... must be a finite number > 0"):
        ClientDP(FGPR(), epsilon=-1.0)


def test_a_resumed_loop_keeps_the_budget_it_spent(tmp_path):
    privacy = ClientDP(FGPR(), epsilon=4.0, delta=1e-5, rate=0.5, reproducible=True)
    unbroken = BOLoop(owners(), method(privacy), 4, seed=2).run()

    def interrupt(loop):
        if loop.iteration == 2:
            loop.stop("interrupted")

    folder = tmp_path / "run"
    BOLoop(owners(), method(privacy), 4, seed=2, callbacks=[BOCheckpoint(folder), interrupt]).run()
    resumed = BOLoop(owners(), method(privacy), 4, seed=2, callbacks=[BOCheckpoint(folder)]).run()
    pd.testing.assert_frame_equal(unbroken.history.drop(columns=TIMES), resumed.history.drop(columns=TIMES))
    assert resumed.method.budget.noise == unbroken.method.budget.noise
    # A loop resumed with more iterations keeps the noise its rounds ran at, and the spent budget
    # stops it where that noise runs out (here after the 4 planned iterations).
    more = BOLoop(owners(), method(privacy), 8, seed=2, callbacks=[BOCheckpoint(folder)]).run()
    assert more.method.budget.noise == unbroken.method.budget.noise
    assert more.history["iteration"].max() == 4 and more.stop_reason.startswith("privacy budget: iteration 5")
    assert torch.equal(more.owners[0].X, unbroken.owners[0].X)
