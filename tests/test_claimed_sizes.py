"""Sizes a client claims are checked against the count it cannot fake separately, and the
``summarise`` exchange tolerates failing clients as a training round does."""

import dataclasses
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.engines import tasks as client_side
from fedgp.errors import RoundFailedError, RunWarning
from fedgp.messages.roster import Roster
from fedgp.run.summary import Summary, check_claimed_sizes

DRAWS = fedgp.synthetic.gp_federation(num_clients=8, n=40, d=2, n_test=10, seed=0)


def _lying_engine(claim: int):
    """A sequential engine whose client 3 claims ``claim`` training points at registration."""
    engine = fedgp.engines.Sequential().build(DRAWS.spec, list(DRAWS.federation))
    honest = type(engine)

    class Lying(honest):
        def start(self, strategy, seed):
            roster = super().start(strategy, seed)
            sizes = roster.sizes.clone()
            sizes[3] = claim
            return dataclasses.replace(roster, sizes=sizes)

    engine.__class__ = Lying
    return engine


def test_a_client_claiming_a_million_points_gets_no_extra_weight():
    with pytest.warns(RunWarning, match=r"claimed 1000280 .* counted 320: .*explain it: \[3\]"):
        lied = fedgp.fit(DRAWS.spec, None, rounds=3, engine=_lying_engine(10**6), seed=0)
    assert lied.roster.sizes.tolist() == [40] * 8  # uniform: every client the counted mean
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunWarning)  # honest claims: no warning
        honest = fedgp.fit(DRAWS.spec, DRAWS.federation, rounds=3, seed=0, engine="sequential")
    # all clients hold 40 points, so uniform weights are the honest weights: the same run
    assert lied.state.allclose(honest.state, rtol=1e-10)


def test_size_weighted_sampling_is_not_captured_by_a_liar():
    """FGPR's sampling draws participants with probability p_k: claimed weight 0.998 would give the
    liar all three slots of nearly every round (one distinct participant)."""
    strategy = fedgp.strategies.FGPR(clients_per_round=3, sampling="weighted")
    with pytest.warns(RunWarning, match="uniform weights"):
        result = fedgp.fit(DRAWS.spec, None, strategy, rounds=12, engine=_lying_engine(10**6), seed=0)
    assert result.history["participants"].mean() > 2  # uniform: about 2.6 distinct of 3 draws


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(2, 1000), min_size=2, max_size=12),
    st.integers(0, 11),
    st.integers(-500, 10**6),
)
def test_the_check_names_exactly_the_clients_that_could_explain_it(sizes, liar, lie):
    liar %= len(sizes)
    claimed = list(sizes)
    claimed[liar] = max(2, sizes[liar] + lie)
    roster = Roster(
        [f"c{i}" for i in range(len(sizes))],
        torch.tensor(claimed),
        torch.zeros(len(sizes), dtype=torch.long),
        torch.full((len(sizes),), 2),
    )
    summary = Summary(torch.arange(len(sizes)), float(sum(sizes)))
    if claimed == sizes:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert check_claimed_sizes(roster, summary) is roster
        return
    with pytest.warns(RunWarning, match="uniform weights") as caught:
        checked = check_claimed_sizes(roster, summary)
    assert len(set(checked.sizes.tolist())) == 1
    if claimed[liar] > sizes[liar]:  # the liar is always among the named ones (when listed)
        named = str(caught[0].message).split("explain it: ", 1)[1]
        excess = claimed[liar] - sizes[liar]
        suspects = [i for i, c in enumerate(claimed) if c - excess >= 2]
        if suspects.index(liar) < 10:
            assert repr(f"c{liar}") in named


@pytest.fixture
def client_3_fails_the_summary(monkeypatch):
    honest = client_side.client_summaries

    def summaries(clients, stage, *args, **kwargs):
        out = honest(clients, stage, *args, **kwargs)
        for row, c in enumerate(clients):
            if c.id == 3:
                for value in out.values():
                    value[row] = float("nan")
        return out

    monkeypatch.setattr(client_side, "client_summaries", summaries)


def test_the_summary_tolerates_a_failing_client_as_a_round_does(client_3_fails_the_summary):
    result = fedgp.fit(DRAWS.spec, DRAWS.federation, rounds=2, engine="sequential", seed=0)
    first = result.failures.iloc[0]
    assert (first["round"], first["client"]) == (0, 3) and first["reason"].startswith("summarise:")
    # the transform is the seven replying clients' statistics
    seven = torch.cat([c.y for c in DRAWS.federation if c.id != 3])
    assert float(result.transform.y_offset) == pytest.approx(float(seven.mean()), rel=1e-12)
    with pytest.raises(
        RoundFailedError,
        match=r"before round 1 \(summarise\): 7 of 8 .* the data transforms were not learned",
    ):
        fedgp.fit(DRAWS.spec, DRAWS.federation, rounds=2, seed=0, faults=fedgp.run.Faults(min_replies=1.0))
