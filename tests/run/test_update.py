"""``FitResult.update``: an owner adds rows after ``fit``, and every door of the result conditions on
all its rows — equal, to 1e-8, to conditioning the same hyper-parameters on the concatenated data —
while the shared state and the federation's transforms stay as fitted."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.engines.base import Engine
from fedgp.errors import InputError, UnknownClientError
from fedgp.models.posterior import condition, prediction_metrics
from fedgp.strategies import FGPR, IFCA
from fedgp.transforms import Standardize, Transforms

TOL = 1e-8
NAN, INF = float("nan"), float("inf")
LOCAL = Transforms(outcome=Standardize(local=True))


def _rows(n: int, i: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    X = 3 * torch.rand(n, 2, generator=g, dtype=torch.float64) + i
    y = 40 + 7 * torch.sin(2 * X[:, 0]) + X[:, 1] + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def _federation(names: bool = False) -> Federation:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(3):
        X, y = _rows(20, i, g)
        Xt, yt = _rows(6, i, g)
        if names:
            X, Xt = pd.DataFrame(X.numpy(), columns=["a", "b"]), pd.DataFrame(Xt.numpy(), columns=["a", "b"])
        out.append(ClientData(X, y, id=f"owner-{i}", X_test=Xt, y_test=yt))
    return Federation(out)


def _fit(strategy=None, transforms="auto", engine="sequential", federation=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fedgp.fit(
            fedgp.GPSpec(), federation or _federation(), strategy or FGPR(local_steps=2), rounds=2,
            engine=engine, transforms=transforms, callbacks=[fedgp.run.Progress(False)],
        )  # fmt: skip


def _close(a, b) -> None:
    torch.testing.assert_close(a.mean, b.mean, rtol=0, atol=TOL)
    torch.testing.assert_close(a.variance_f, b.variance_f, rtol=0, atol=TOL)
    torch.testing.assert_close(a.variance_y, b.variance_y, rtol=0, atol=TOL)
    if a.covariance_f is not None:
        torch.testing.assert_close(a.covariance_f, b.covariance_f, rtol=0, atol=TOL)


def _new(k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _rows(k, 1, torch.Generator().manual_seed(seed))


AT = _rows(7, 1, torch.Generator().manual_seed(123))[0]


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize("transforms", [None, "auto", LOCAL], ids=["none", "federated", "own"])
def test_update_then_predict_equals_conditioning_on_the_concatenated_rows(engine, transforms):
    fed = _federation()
    result = _fit(transforms=transforms, engine=engine, federation=fed)
    state, units = dict(result.state), result.transforms
    before = result.posterior(AT, "owner-1")
    Xs, ys = [fed[1].X], [fed[1].y]
    for k, seed in [(1, 1), (30, 2), (3, 3)]:  # k = 1, then more rows than the owner held
        X_new, y_new = _new(k, seed)
        result.update("owner-1", X_new, y_new)
        Xs.append(X_new)
        ys.append(y_new)
        grown = ClientData(torch.cat(Xs), torch.cat(ys), id="all rows")
        # FGPR conditions a client it never saw on the global state: the same hyper-parameters.
        _close(result.posterior(AT, "owner-1", full_cov=True), result.posterior(AT, grown, full_cov=True))
    assert result.federation[1].n == 20 + 34 and torch.equal(result.federation[1].X, torch.cat(Xs))
    assert all(torch.equal(state[k], v) for k, v in result.state.items())  # the shared state as fitted
    assert result.transforms == units  # and the federation's units
    _close(result.posterior(AT, 0), result.posterior(AT, fed[0]))  # other owners as before
    # The owner's old ClientData is now a client holding those rows only: the prediction before.
    _close(result.posterior(AT, fed[1]), before)


def test_the_update_equals_a_refit_of_the_posterior_in_the_models_units():
    fed = _federation()
    result = _fit(transforms="auto", federation=fed)
    X_new, y_new = _new(5, 7)
    result.update(2, X_new, y_new)
    t = result.transform
    X, y = torch.cat([fed[2].X, X_new]), torch.cat([fed[2].y, y_new])
    state = result.client_state(2)
    ref = t.untransform(
        condition(result.spec, state, t.inputs(X), (y - t.y_offset) / t.y_scale, t.inputs(AT))
    )
    _close(result.posterior(AT, 2), ref)


@pytest.mark.parametrize(
    "strategy",
    [IFCA(num_clusters=2, local_steps=2), FGPR(local_steps=2, personal=("noise",))],
    ids=["ifca", "personal"],
)
def test_an_owner_keeps_its_own_state_and_conditions_on_all_its_rows(strategy):
    """A clustered owner keeps its cluster's state, an owner with personal values its own."""
    fed = _federation()
    result = _fit(strategy, federation=fed)
    state = result.client_state("owner-0")
    X_new, y_new = _new(4, 5)
    result.update("owner-0", X_new, y_new)
    assert all(torch.equal(state[k], v) for k, v in result.client_state("owner-0").items())
    t = result.transform
    X, y = torch.cat([fed[0].X, X_new]), torch.cat([fed[0].y, y_new])
    y = (y - t.y_offset) / t.y_scale
    _close(
        result.posterior(AT, "owner-0"),
        t.untransform(condition(result.spec, state, t.inputs(X), y, t.inputs(AT))),
    )


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_ask_evaluate_combine_and_export_read_the_grown_owner(engine):
    result = _fit(engine=engine)
    X_new, y_new = _new(6, 11)
    result.update("owner-1", X_new, y_new)
    mine = result.posterior(AT, "owner-1", full_cov=True)
    asked = result.ask("predict", "owner-1", AT, full_cov=True)
    assert torch.equal(asked["mean"], mine.mean) and torch.equal(asked["covariance_f"], mine.covariance_f)
    data = result.client_data("owner-1")
    at_test = result.posterior(data.X_test, "owner-1")
    expected = prediction_metrics([at_test], [data.y_test])
    row = result.evaluate().set_index("client").loc["owner-1"]
    assert row["rmse"] == pytest.approx(float(expected["rmse"][0]), abs=1e-9)
    assert row["nll"] == pytest.approx(float(expected["nll"][0]), abs=1e-9)
    # combine= asks every owner's posterior: the grown owner's is the one it now has.
    alone = fedgp.models.experts.combine_experts(
        torch.stack([result.posterior(AT, i).mean for i in range(3)]),
        torch.stack([result.posterior(AT, i).variance_f for i in range(3)]),
        "poe",
    )
    combined = result.posterior(AT, combine="poe")
    torch.testing.assert_close(combined.mean, alone[0], rtol=0, atol=TOL)
    model = result.to_gpytorch("owner-1")  # an ExactGP conditioned on all of the owner's rows
    assert model.train_inputs[0].shape[0] == 26
    with torch.no_grad():
        torch.testing.assert_close(model(AT).mean, mine.mean, rtol=0, atol=TOL)  # in the data's units


def test_a_saved_model_predicts_the_grown_owner_from_its_rows(tmp_path):
    fed = _federation()
    result = _fit(federation=fed)
    X_new, y_new = _new(8, 3)
    result.update("owner-2", X_new, y_new)
    loaded = fedgp.load(result.save(tmp_path / "model.fedgp"))
    _close(loaded.posterior(AT, result.client_data("owner-2")), result.posterior(AT, "owner-2"))


def test_a_continuing_run_warm_starts_from_the_state_on_the_grown_rows():
    result = _fit()
    result.update("owner-0", *_new(10, 4))
    spec = result.warm_spec()
    start = spec.initial_state()
    assert all(torch.allclose(start[k], v, rtol=0, atol=1e-15) for k, v in result.state.items())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        more = fedgp.fit(spec, result.federation, FGPR(local_steps=1), rounds=1, engine="sequential")
    assert more.roster.sizes.tolist() == [30, 20, 20]


def test_named_columns_are_matched_by_name():
    fed = _federation(names=True)
    result = _fit(federation=fed)
    X_new, y_new = _new(4, 9)
    frame = pd.DataFrame(X_new.numpy(), columns=["a", "b"])[["b", "a"]]  # another order
    result.update("owner-1", frame, y_new.numpy())
    assert result.federation[1].feature_names == ("a", "b")
    torch.testing.assert_close(result.federation[1].X[-4:], X_new, rtol=0, atol=0)
    wrong = pd.DataFrame(X_new.numpy(), columns=["a", "c"])
    named = "update for client 'owner-1'.*missing 'b'.*not features of the model 'c'"
    with pytest.raises(InputError, match=named):
        result.update("owner-1", wrong, y_new)


@pytest.mark.parametrize(
    "X, y, message",
    [
        (torch.ones(3, 3), torch.ones(3), "client 'owner-1'.*X_new has 3 input columns.*takes 2"),
        (torch.tensor([[1.0, NAN]]), torch.ones(1), "client 'owner-1': X_new contains 1 non-finite"),
        (torch.ones(2, 2), torch.tensor([1.0, INF]), "client 'owner-1': y_new contains 1 non-finite"),
        (torch.ones(3, 2), torch.ones(2), "client 'owner-1': X_new has 3 rows but y_new has 2"),
        (torch.ones(0, 2), torch.ones(0), "update for client 'owner-1': X_new has no rows"),
        (torch.ones(2), torch.ones(2), "client 'owner-1': X_new must be 2-D"),
        (np.array([["a", "b"]]), np.ones(1), "client 'owner-1'.*X_new"),
    ],
)
def test_bad_rows_are_refused_naming_the_owner_and_the_field(X, y, message):
    result = _fit()
    before = result.posterior(AT, "owner-1")
    with pytest.raises(InputError, match=message):
        result.update("owner-1", X, y)
    _close(result.posterior(AT, "owner-1"), before)  # nothing was applied
    assert result.federation[1].n == 20


def test_who_cannot_add_rows_is_told_why(tmp_path):
    result = _fit()
    rows = _new(2, 0)
    with pytest.raises(UnknownClientError, match="client='nobody': no client with id 'nobody'"):
        result.update("nobody", *rows)
    with pytest.raises(UnknownClientError, match="client=7: no client at that position"):
        result.update(7, *rows)
    with pytest.raises(InputError, match="client 'stranger' is not one of the 3 owners"):
        result.update(ClientData(*_new(3, 1), id="stranger"), *rows)
    loaded = fedgp.load(result.save(tmp_path / "m.fedgp"))
    with pytest.raises(InputError, match="loaded from a file and holds no client data"):
        loaded.update(ClientData(*_new(3, 1), id="owner-0"), *rows)

    class Remote(Engine):  # an engine whose owners are elsewhere, as Ray's and Flower's are
        name = "remote"

        def start(self, strategy, seed):
            raise NotImplementedError

        def run(self, task, clients, fields):
            raise NotImplementedError

    result.engine = Remote()
    with pytest.raises(InputError, match="client 'owner-0'.*'remote' engine hosts its owners' data in their"):
        result.update("owner-0", *rows)


@settings(max_examples=8)
@given(
    ks=st.lists(st.integers(1, 25), min_size=1, max_size=3), owner=st.integers(0, 2), seed=st.integers(0, 999)
)
def test_any_sequence_of_updates_equals_conditioning_on_all_rows(ks, owner, seed):
    fed = _federation()
    result = _fit(federation=fed)
    Xs, ys = [fed[owner].X], [fed[owner].y]
    for j, k in enumerate(ks):
        X_new, y_new = _new(k, seed + j)
        result.update(fed[owner].id, X_new, y_new)
        Xs.append(X_new)
        ys.append(y_new)
    grown = ClientData(torch.cat(Xs), torch.cat(ys), id="all rows")
    _close(result.posterior(AT, owner, full_cov=True), result.posterior(AT, grown, full_cov=True))
