"""Shrinkage of personal hyper-parameters (issue 52, item 3): the prior's two limits, its gradient and
proximal step, the evidence's width, and that width's stability across split seeds."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.errors import InputError
from fedgp.experiments.convergence import central_personal_optimum
from fedgp.experiments.owner_scale import OWN_SD, gain_owners, scale_spec
from fedgp.models.objective import minibatch_nll
from fedgp.run import Evaluate, Progress
from fedgp.strategies import FGPR, Shrinkage
from fedgp.strategies.shrinkage import (
    GRID,
    evidence_statistics,
    evidence_width,
    evidence_widths,
    laplace_moments,
    prior_gradient,
    prior_penalty,
    proximal,
)

QUIET = [Evaluate(every=0), Progress(False)]
NOISE = "likelihood.noise_covar.noise"


def _fit(strategy, fed, rounds=8):
    return fedgp.fit(scale_spec(), fed, strategy, rounds=rounds, seed=0, transforms=OWN_SD,
                     engine="sequential", callbacks=QUIET)  # fmt: skip


def _largest_difference(a, b, owners=4) -> float:
    """The largest difference between two fits' owner states (every hyper-parameter)."""
    worst = 0.0
    for k in range(owners):
        sa, sb = a.client_state(k), b.client_state(k)
        worst = max(worst, *(float((sa[n] - sb[n]).abs().max()) for n in sa))
    return worst


@pytest.fixture(scope="module")
def owners():
    return gain_owners(population=0, split=0, per_group=1, n=24)


@pytest.fixture(scope="module")
def unshrunk(owners):
    return _fit(FGPR(personal=("scale",)), owners)


@pytest.fixture(scope="module")
def shared(owners):
    return _fit(FGPR(), owners)


def test_infinite_width_is_todays_personal_fit(owners, unshrunk):
    """No prior (``None``, for every name or by name) is ``FGPR(personal=("scale",))`` to 1e-10."""
    for shrink in (Shrinkage(None), Shrinkage(widths={"noise": None, "outputscale": None})):
        assert _largest_difference(_fit(FGPR(personal=("scale",), shrink=shrink), owners), unshrunk) < 1e-10


def test_zero_width_is_the_shared_fit_and_a_tiny_width_tends_to_it(owners, shared, unshrunk):
    """Width 0 is the shared-value fit (``FGPR()``) to 1e-10; so is width 1e-6, through the kept
    offsets and their proximal steps (the offsets vanish, the shared value takes the likelihood's
    steps); a finite width lies between the shared and the unshrunk fit."""
    zero = _fit(FGPR(personal=("scale",), shrink=Shrinkage(0.0)), owners)
    tiny = _fit(FGPR(personal=("scale",), shrink=Shrinkage(1e-6)), owners)
    assert _largest_difference(zero, shared) < 1e-10
    assert _largest_difference(tiny, shared) < 1e-10
    middle = _fit(FGPR(personal=("scale",), shrink=Shrinkage(0.5)), owners)
    assert _largest_difference(middle, shared) > 1e-3
    assert _largest_difference(middle, unshrunk) > 1e-3


def test_owners_differ_less_the_narrower_the_prior(owners, unshrunk):
    """The spread of the owners' raw noise shrinks as the width does."""
    spec = unshrunk.spec

    def spread(result):
        p = spec.param(NOISE)
        raw = torch.stack([p.inverse_transform(result.client_state(k)[NOISE]) for k in range(len(owners))])
        return float(raw.std())

    widths = [spread(_fit(FGPR(personal=("scale",), shrink=Shrinkage(w)), owners)) for w in (0.05, 0.5)]
    assert widths[0] < widths[1] < spread(unshrunk), widths


@settings(max_examples=40, deadline=None)
@given(
    offsets=st.lists(st.floats(-5, 5), min_size=2, max_size=5),
    width=st.floats(0.01, 10),
    step=st.floats(0.01, 2),
)
def test_the_priors_gradient_and_proximal_step(offsets, width, step):
    """The prior's gradient equals autograd's and central finite differences'; the proximal step
    zeroes the gradient of ``penalty(δ') + |δ' - δ|² / (2 step)``."""
    delta = torch.tensor(offsets, dtype=torch.float64)[:, None]
    n = torch.arange(1, len(offsets) + 1, dtype=torch.long) * 7
    x = delta.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(prior_penalty(x, width, n).sum(), x)
    closed = prior_gradient(delta, width, n)
    assert torch.allclose(auto, closed, rtol=1e-12, atol=1e-14)
    h = 1e-5
    numeric = (prior_penalty(delta + h, width, n) - prior_penalty(delta - h, width, n)) / (2 * h)
    assert torch.allclose(numeric[:, None], closed, rtol=1e-6, atol=1e-8)
    moved = proximal(delta, width, n, step).requires_grad_(True)
    objective = prior_penalty(moved, width, n).sum() + ((moved - delta) ** 2).sum() / (2 * step)
    (g,) = torch.autograd.grad(objective, moved)
    assert g.abs().max() < 1e-10
    assert torch.equal(proximal(delta, 0.0, n, step), torch.zeros_like(delta))


def test_laplace_variance_is_the_inverse_curvature_of_the_owners_likelihood(owners, unshrunk):
    """One name, at the owner's own optimum: the Laplace variance is 1 / (second central difference of
    the owner's total NLL)."""
    spec = unshrunk.spec
    clients, _, _ = unshrunk.transform.apply_all(list(owners))
    client = clients[0]
    (states, _) = central_personal_optimum(spec, [client], frozenset(spec.names), restarts=1)
    state = states[0]
    values, variances = laplace_moments(spec, state, client.X, client.y, [NOISE])
    model, p = spec.build(), spec.param(NOISE)

    def total(raw):
        spec.load(model, {**state, NOISE: p.transform(raw)})
        with torch.no_grad():
            return float(minibatch_nll(model, client.X, client.y, prior_weight=0.0)) * client.n

    raw, h = p.inverse_transform(state[NOISE]), 1e-4
    curvature = (total(raw + h) - 2 * total(raw) + total(raw - h)) / h**2
    assert torch.allclose(values[NOISE], raw.reshape(-1))
    assert float(variances[NOISE][0]) == pytest.approx(1 / curvature, rel=1e-4)


def test_the_evidence_finds_the_spread_of_the_owners_values():
    """400 owners' fits ``φ̂_k ~ N(1, w² + s_k²)``: the chosen width is within 15 % of w = 0.7, and a
    population with no spread (w = 0) gets a width below 0.1; an owner whose likelihood is flat
    (infinite variance) changes nothing."""
    g = torch.Generator().manual_seed(0)
    s = 0.1 + 0.5 * torch.rand(400, generator=g, dtype=torch.float64)
    for true, check in ((0.7, lambda w: abs(w - 0.7) < 0.105), (0.0, lambda w: w < 0.1)):
        phi = 1 + torch.randn(400, generator=g, dtype=torch.float64) * torch.sqrt(true**2 + s**2)
        summed = sum(evidence_statistics(v[None], u[None] ** 2) for v, u in zip(phi, s))
        width = evidence_width(summed)
        assert check(width), (true, width)
        flat = evidence_statistics(torch.tensor([50.0]), torch.tensor([math.inf]))
        assert evidence_width(summed + flat) == width
    with pytest.raises(InputError, match="curved"):
        evidence_width(torch.zeros(4, len(GRID)))


def test_the_evidence_chooses_the_same_widths_on_every_split_of_one_population():
    """Split seeds 0, 1, 2 of one population: each name's width is 0 on every seed or positive on
    every seed, within 1.5x across seeds (measured: the same grid point on every seed)."""
    chosen = []
    for split in (0, 1, 2):
        fed = gain_owners(population=0, split=split, per_group=2, n=40)
        strategy = FGPR(personal=("scale",))
        result = fedgp.fit(scale_spec(), fed, strategy, rounds=40, seed=split, transforms=OWN_SD,
                           callbacks=QUIET)  # fmt: skip
        clients, _, _ = result.transform.apply_all(list(fed))
        states = [result.client_state(k) for k in range(len(fed))]
        chosen.append(
            dict(evidence_widths(result.spec, states, clients, strategy.personal_names(result.spec)).widths)
        )
    for name in chosen[0]:
        values = [c[name] for c in chosen]
        assert all(v == 0 for v in values) or (min(values) > 0 and max(values) / min(values) <= 1.5), (
            name,
            values,
        )
    assert chosen[0][NOISE] > 0  # the groups' noises differ 100x: the noise is not pooled


def test_bad_widths_are_refused_naming_them(owners):
    with pytest.raises(InputError, match="'noise'"):
        Shrinkage(widths={"noise": -1.0})
    with pytest.raises(InputError, match="width"):
        Shrinkage(math.inf)
    with pytest.raises(InputError, match="lengthscale"):
        _fit(FGPR(personal=("noise",), shrink=Shrinkage(widths={"lengthscale": 1.0})), owners, rounds=1)
    with pytest.raises(
        InputError, match=r"FGPR: shrink= shrinks personal hyper-parameters, but personal= names"
    ):
        FGPR(shrink=Shrinkage(0.5))  # before: accepted, and the fit was FGPR()'s, shrinking nothing
    shrink = Shrinkage(0.5, widths={"noise": None})
    assert Shrinkage.from_config(shrink.to_config()) == shrink
    strategy = FGPR(personal=("scale",), shrink=shrink)
    assert FGPR.from_config(strategy.to_config()) == strategy  # a run's settings record it


def test_the_batched_engine_shrinks_as_the_sequential_one(owners):
    """The offsets live in the engine's client memory: the batched engine's fit is the sequential
    one's (1e-10)."""
    strategy = FGPR(personal=("scale",), shrink=Shrinkage(0.5))
    fits = [
        fedgp.fit(
            scale_spec(),
            owners,
            strategy,
            rounds=5,
            seed=0,
            transforms=OWN_SD,
            engine=engine,
            callbacks=QUIET,
        )  # fmt: skip
        for engine in ("sequential", "batched")
    ]
    assert _largest_difference(*fits) < 1e-10


def test_the_owners_offsets_are_saved_and_checkpointed_and_clientdp_refuses_them(owners, tmp_path):
    """A saved file and a checkpoint hold each owner's offset (``offset/<name>``) beside its personal
    values: the loaded model predicts every owner as the fitted one, bit for bit, and a resumed run
    ends as the unbroken one. ClientDP's clipped update does not carry the offsets: it refuses."""
    strategy = FGPR(personal=("scale",), shrink=Shrinkage(1.0))
    full = _fit(strategy, owners, rounds=4)
    kept = full.personal_values()
    assert all(any(n.startswith("offset/") for n in values) for values in kept.values())
    loaded = fedgp.load(full.save(tmp_path / "model.fedgp"))
    X = torch.linspace(0.0, 1.0, 5, dtype=torch.float64)[:, None]
    for client in owners:
        for ours, ref in zip(loaded.predict(X, client, True), full.predict(X, client.id, True)):
            assert torch.equal(ours, ref)
    path = tmp_path / "run.ckpt"
    checkpoint = fedgp.run.Checkpointing(path)
    fedgp.fit(scale_spec(), owners, strategy, rounds=2, seed=0, transforms=OWN_SD, engine="sequential",
              callbacks=[*QUIET, checkpoint])  # fmt: skip
    resume = fedgp.run.Checkpointing(path, every=None, resume=True)
    resumed = fedgp.fit(scale_spec(), owners, strategy, rounds=4, seed=0, transforms=OWN_SD,
                        engine="sequential", callbacks=[*QUIET, resume])  # fmt: skip
    assert resumed.state == full.state
    again = resumed.personal_values()
    assert all(torch.equal(again[o][n], kept[o][n]) for o in kept for n in kept[o])
    with pytest.raises(InputError, match=r"shrink=.*not supported under ClientDP"):
        _fit(fedgp.run.ClientDP(strategy, noise=1.0, clip=1.0), owners, rounds=1)
