"""``FitResult`` asks its own questions: a training client of an in-process engine predicts here, a
new client without an engine, and both give what the protocol's ``predict`` task gives, bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.engines import Sequential
from fedgp.errors import EngineError
from fedgp.strategies import FGPR, IFCA
from fedgp.transforms import Standardize, Transforms


def _federation(seed: int = 0, clients: int = 4) -> Federation:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(clients):
        X = 3 * torch.rand(20, 2, generator=g, dtype=torch.float64) + i
        y = (
            40
            + 7 * torch.sin(2 * X[:, 0])
            + X[:, 1]
            + 0.3 * torch.randn(20, generator=g, dtype=torch.float64)
        )
        out.append(ClientData(X, y, id=f"owner-{i}"))
    return Federation(out)


def _fit(strategy, transforms="auto", engine="sequential", federation=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fedgp.fit(
            fedgp.GPSpec(), federation or _federation(), strategy, rounds=3, engine=engine,
            transforms=transforms, callbacks=[fedgp.run.Progress(False)],
        )  # fmt: skip


def _same(a: fedgp.models.posterior.Prediction, b: dict, full_cov: bool) -> None:
    assert torch.equal(a.mean, b["mean"]) and torch.equal(a.variance_f, b["variance_f"])
    assert torch.equal(a.variance_y, b["variance_y"])
    if full_cov:
        assert torch.equal(a.covariance_f, b["covariance_f"])


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize(
    "strategy, transforms",
    [
        (FGPR(local_steps=2), "auto"),
        (FGPR(local_steps=2), Transforms(outcome=Standardize(local=True))),
        (IFCA(num_clusters=2, local_steps=2), "auto"),
    ],
)
@pytest.mark.parametrize("full_cov", [False, True])
def test_a_training_client_predicts_here_what_the_predict_task_answers(
    engine, strategy, transforms, full_cov
):
    result = _fit(strategy, transforms, engine)
    X = torch.rand(6, 2, dtype=torch.float64) * 4
    for position in range(len(result.roster.ids)):
        here = result.posterior(X, position, full_cov=full_cov)
        through_the_engine = result._answer("predict", position, X, full_cov)  # the protocol's task
        _same(here, through_the_engine, full_cov)
        asked = result.ask("predict", position, X, full_cov)
        _same(here, asked, full_cov)


def test_the_in_process_answer_follows_the_engine_when_another_fit_ran_on_it():
    """One engine instance, two fits with other units: the first result still predicts in its own."""
    federation = _federation()
    engine = Sequential().build(fedgp.GPSpec().for_inputs(2), list(federation), 0)
    X = torch.rand(5, 2, dtype=torch.float64) * 4
    first = _fit(FGPR(local_steps=2), "auto", engine, federation)
    before = first.posterior(X, 1)
    _fit(FGPR(local_steps=2), None, engine, federation)  # the engine now holds the raw data
    after = first.posterior(X, 1)
    assert torch.equal(before.mean, after.mean) and torch.equal(before.variance_y, after.variance_y)
    _same(after, first._answer("predict", 1, X, False), False)


def test_a_changed_server_state_is_not_answered_from_the_kept_personal_state():
    result = _fit(IFCA(num_clusters=2, local_steps=2))
    X = torch.rand(4, 2, dtype=torch.float64) * 4
    result.posterior(X, 0)
    other = _fit(IFCA(num_clusters=2, local_steps=2), federation=_federation(seed=5))
    result.server_state = other.server_state
    _same(result.posterior(X, 0), result._answer("predict", 0, X, False), False)


def test_a_new_client_is_answered_without_an_engine_as_a_training_client_is():
    """A copy of a training client, given as a new ClientData, gets the training client's posterior
    (FGPR conditions everyone on the same state), computed with no engine and no registration."""
    result = _fit(FGPR(local_steps=2))
    member = result.federation[2]
    copy = ClientData(member.X.clone(), member.y.clone(), id="newcomer")
    X = torch.rand(5, 2, dtype=torch.float64) * 4
    new, known = result.posterior(X, copy), result.posterior(X, 2)
    torch.testing.assert_close(new.mean, known.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new.variance_y, known.variance_y, rtol=1e-12, atol=1e-12)
    assert set(result.ask("personal", copy)) == set(result.ask("personal", 2))


def test_a_client_that_cannot_predict_says_so_by_name():
    result = _fit(FGPR(local_steps=2))
    with pytest.raises(EngineError, match="owner-1.*could not predict"):
        result._predict_here(1, torch.full((3, 5), 1.0, dtype=torch.float64), False)  # 5 columns, not 2
