"""Back to the data's units (``DataTransform.untransform``, the maps of ``fedgp.models.units``): a
prediction, metrics and a state mapped back are the same GP on the original data — checked against
the formulas the clients, combined prediction and the history wrote out before, against closed
forms, and against a model built from the mapped state and conditioned on the raw data."""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data import ClientData
from fedgp.errors import InputError, InputTypeError
from fedgp.models.posterior import Prediction, predict_with_model, prediction_metrics
from fedgp.models.spec import BIAS, CONSTANT, LENGTHSCALE, NOISE, OUTPUTSCALE, WEIGHTS
from fedgp.models.state import HyperState
from fedgp.strategies import FGPR
from fedgp.transforms import DataTransform, Standardize, Transforms
from tests.test_transforms import raw_federation

F64 = torch.float64


def _transform(d=2, seed=0, **outcome) -> DataTransform:
    g = torch.Generator().manual_seed(seed)
    x = dict(
        x_offset=torch.randn(d, generator=g, dtype=F64) * 10,
        x_scale=torch.rand(d, generator=g, dtype=F64) * 20 + 0.5,
    )
    return DataTransform(**x, **outcome)


# -- the inline formulas it replaces ---------------------------------------------------------------------


def test_replies_have_the_bits_of_the_clients_inline_formulas():
    """engines/client.py wrote ``stack.double() * scale[:, None] + offset[:, None]``, variances times
    ``(scale * scale)[:, None]``, ``rmse * scale``, ``nll + scale.log()``: the same bits, every field."""
    g = torch.Generator().manual_seed(1)
    k, n = 4, 6
    offset = torch.randn(k, generator=g, dtype=F64) * 40
    scale = torch.rand(k, generator=g, dtype=F64) * 25 + 0.05
    M, V = torch.randn(k, n, generator=g), torch.rand(k, n, generator=g)  # float32, as a float32 spec's
    C = torch.rand(k, n, n, generator=g, dtype=F64)
    reply = {"mean": M, "variance_f": V, "variance_y": V + 0.5, "covariance_f": C, "mean_f": M}
    out = DataTransform(y_local=True).untransform(reply, offset, scale)
    column, square = scale.unsqueeze(1), (scale * scale).unsqueeze(1)
    assert torch.equal(out["mean"], M.double() * column + offset.unsqueeze(1))
    assert torch.equal(out["variance_f"], V.double() * square)
    assert torch.equal(out["variance_y"], (V + 0.5).double() * square)
    assert torch.equal(out["covariance_f"], C * square.unsqueeze(-1))
    assert torch.equal(out["mean_f"], M.double())  # a non-Gaussian likelihood's latent f: as it is
    metrics = {
        "rmse": torch.rand(k, dtype=F64),
        "nll": torch.randn(k, dtype=F64),
        "coverage95": torch.rand(k, dtype=F64),
    }
    back = DataTransform(y_local=True).untransform(metrics, offset, scale)
    assert torch.equal(back["rmse"], metrics["rmse"] * scale)
    assert torch.equal(back["nll"], metrics["nll"] + scale.log())
    assert torch.equal(back["coverage95"], metrics["coverage95"])
    one = DataTransform(y_local=True).untransform(Prediction(M, V, V + 0.5, C, M), offset, scale)
    assert all(
        torch.equal(getattr(one, a), out[b])
        for a, b in [("mean", "mean"), ("covariance_f", "covariance_f"), ("latent_mean", "mean_f")]
    )


def test_the_default_map_is_the_transforms_own_and_has_combined_predictions_bits():
    """run/combined.py wrote ``offset + scale * mean`` and ``scale * scale * variance`` with the
    transform's floats; the history wrote ``m + s * c`` and ``v * s * s``."""
    t = DataTransform(y_offset=torch.tensor(151.25, dtype=F64), y_scale=torch.tensor(48.3, dtype=F64))
    o, s = float(t.y_offset), float(t.y_scale)
    mean, var = torch.randn(9, dtype=F64), torch.rand(9, dtype=F64)
    p = t.untransform(Prediction(mean, var, var))
    assert torch.equal(p.mean, o + s * mean) and torch.equal(p.variance_f, s * s * var)
    assert t.untransform({"rmse": 0.5, "nll": 1.0}) == {"rmse": 0.5 * s, "nll": 1.0 + math.log(s)}
    state = HyperState(
        {CONSTANT: torch.tensor(0.3, dtype=F64), NOISE: torch.tensor([0.02], dtype=F64)},
        {CONSTANT: (), NOISE: (1,)},
    )
    back = t.untransform(state)
    assert float(back["mean_module.constant"]) == o + s * 0.3
    assert float(back[NOISE][0]) == pytest.approx(0.02 * s * s, rel=1e-15)
    identity = DataTransform().untransform(Prediction(mean, var, var))
    assert torch.equal(identity.mean, mean) and torch.equal(identity.variance_y, var)


def test_what_it_cannot_map_is_refused_naming_it():
    local = DataTransform(y_local=True)
    with pytest.raises(InputError, match=r"own mean and sd.*outcome_map"):
        local.untransform(Prediction(torch.zeros(2), torch.ones(2), torch.ones(2)))
    with pytest.raises(InputError, match="both offset and scale"):
        DataTransform().untransform({"rmse": 1.0}, offset=1.0)
    with pytest.raises(InputError, match="'r2'"):
        DataTransform().untransform({"r2": 0.5})
    with pytest.raises(InputTypeError, match="Prediction, a HyperState or a mapping"):
        DataTransform().untransform(torch.zeros(3))
    period = "covar_module.base_kernel.period_length"
    state = HyperState(
        {period: torch.ones(1, 1, dtype=F64), NOISE: torch.ones(1, dtype=F64)}, {period: (1, 1), NOISE: (1,)}
    )
    with pytest.raises(InputError, match=r"period_length \(no map.*partial=True"):
        _transform().untransform(state)
    assert list(_transform().untransform(state, partial=True)) == [NOISE]
    with pytest.raises(InputError, match=r"likelihood.noise_covar.noise \(in y's units"):
        local.untransform(state, partial=False)
    mapped = local.untransform(state, 2.0, 3.0, partial=True)  # with the client's own map it has one
    assert float(mapped[NOISE][0]) == 9.0


# -- closed forms --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    d=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    o=st.floats(-1e3, 1e3),
    s=st.floats(1e-2, 1e3),
    batch=st.sampled_from([(), (3,), (2, 3)]),
)
def test_a_state_in_the_data_units_is_the_same_gp(d, seed, o, s, batch):
    """Property: the mapped hyper-parameters give, on the raw inputs, the mean, kernel and noise that
    the learned ones give on the transformed inputs, mapped by y = o + s·y' (RBF, linear mean)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(d, generator=g, dtype=F64) * 50, torch.rand(d, generator=g, dtype=F64) * 30 + 1e-2
    t = DataTransform(
        x_offset=a, x_scale=b, y_offset=torch.tensor(o, dtype=F64), y_scale=torch.tensor(s, dtype=F64)
    )
    shared = bool(seed % 2)
    events = {
        NOISE: (1,),
        OUTPUTSCALE: (),
        LENGTHSCALE: (1, 1 if shared else d),
        WEIGHTS: (d, 1),
        BIAS: (1,),
        CONSTANT: (),
    }
    learned = HyperState(
        {
            n: torch.rand((*batch, *e), generator=g, dtype=F64)
            + (0.1 if n in (NOISE, OUTPUTSCALE, LENGTHSCALE) else -0.5)
            for n, e in events.items()
        },
        events,
    )
    data = t.untransform(learned)
    assert data.batch_shape == learned.batch_shape and data.event_shapes[LENGTHSCALE] == (1, d)
    x1, x2 = torch.randn(d, generator=g, dtype=F64) * 40, torch.randn(d, generator=g, dtype=F64) * 40
    u1, u2 = (x1 - a) / b, (x2 - a) / b  # the same inputs, transformed
    w, c = learned[WEIGHTS][..., 0], learned[BIAS][..., 0]
    linear_then = o + s * ((w * u1).sum(-1) + c)
    linear_now = (data[WEIGHTS][..., 0] * x1).sum(-1) + data[BIAS][..., 0]
    torch.testing.assert_close(linear_now, linear_then, rtol=1e-9, atol=1e-9 * (abs(o) + s))
    ls = learned[LENGTHSCALE][..., 0, :]
    k_then = s * s * learned[OUTPUTSCALE] * torch.exp(-0.5 * (((u1 - u2) / ls) ** 2).sum(-1))
    k_now = data[OUTPUTSCALE] * torch.exp(-0.5 * (((x1 - x2) / data[LENGTHSCALE][..., 0, :]) ** 2).sum(-1))
    torch.testing.assert_close(k_now, k_then, rtol=1e-9, atol=1e-300)
    torch.testing.assert_close(data[NOISE], s * s * learned[NOISE], rtol=1e-15, atol=0)
    torch.testing.assert_close(
        data["mean_module.constant"], o + s * learned[CONSTANT], rtol=1e-15, atol=1e-15 * abs(o)
    )


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 30),
    seed=st.integers(0, 10_000),
    loc=st.floats(-1e4, 1e4),
    spread=st.floats(1e-3, 1e4),
    local=st.booleans(),
)
def test_transform_then_untransform_gives_back_the_targets_and_the_metrics(n, seed, loc, spread, local):
    """Property: a client's targets transformed, then untransformed as a prediction's mean, are its
    targets; and the test metrics of a prediction in model units, mapped back, are the metrics of
    the mapped-back prediction against the raw targets (RMSE, NLL, coverage)."""
    rng = np.random.default_rng(seed)
    y = loc + spread * rng.standard_normal(n)
    client = ClientData(rng.uniform(-5, 5, (n, 2)), y, id="c")
    t = (
        DataTransform(y_local=True)
        if local
        else DataTransform(
            y_offset=torch.tensor(float(y.mean()), dtype=F64),
            y_scale=torch.tensor(float(y.std(ddof=1)), dtype=F64),
        )
    )
    made, offset, scale = t.apply(client)
    maps = (offset, scale) if local else ()
    var = torch.from_numpy(rng.uniform(0.1, 2.0, n))
    back = t.untransform(Prediction(made.y, var, var), *maps)
    torch.testing.assert_close(back.mean, client.y, rtol=1e-12, atol=1e-12 * spread)
    guess = Prediction(made.y + torch.from_numpy(rng.normal(0, 0.5, n)), var, var + 0.1)
    model_units = {k: float(v[0]) for k, v in prediction_metrics([guess], [made.y]).items()}
    mapped = t.untransform(model_units, *maps)
    direct = prediction_metrics([t.untransform(guess, *maps)], [client.y])
    for name in ("rmse", "nll"):
        assert mapped[name] == pytest.approx(float(direct[name][0]), rel=1e-9, abs=1e-9)
    assert (
        abs(mapped["coverage95"] - float(direct["coverage95"][0])) <= 1 / n + 1e-12
    )  # an edge point may flip


# -- a fit: the state in the data's units, conditioned on the raw data, predicts as the result does

SPECS = {
    "constant": lambda: fedgp.GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=2)),
        mean=gpytorch.means.ConstantMean(),
    ),
    "linear": lambda: fedgp.GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)),
        mean=gpytorch.means.LinearMean(2),
    ),
}


@pytest.mark.parametrize("local", [False, True], ids=["federated-sd", "own-sd"])
@pytest.mark.parametrize("mean", list(SPECS))
def test_the_learned_state_in_data_units_is_the_model_the_result_predicts_with(mean, local):
    """Fit with transforms; the state mapped back (each client's own outcome map under local
    standardisation), loaded into the spec's modules and conditioned on the client's raw data, gives
    the result's own prediction: it is the same GP in the data's units."""
    fed = raw_federation(num_clients=3)
    spec = SPECS[mean]()
    result = fedgp.fit(
        spec,
        fed,
        FGPR(batch_size=None, local_steps=3),
        rounds=4,
        transforms=Transforms(outcome=Standardize(local=local)),
    )
    X = torch.tensor([[4.0, -39.0], [12.5, -21.0], [8.0, -30.0]], dtype=F64)
    for position, client in enumerate(fed):
        maps = result.transform.outcome_map(client.y) if local else ()
        data = result.transform.untransform(result.client_state(position), *maps)
        model = spec.build()
        names = {"mean_module.constant": CONSTANT}
        model.initialize(**{names.get(k, k): v for k, v in data.items()})
        ours = predict_with_model(model, client.X, client.y, X)
        theirs = result.posterior(X, client=position)
        torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(ours.variance_y, theirs.variance_y, rtol=1e-8, atol=1e-10)
