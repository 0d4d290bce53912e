"""Owners that measure in different units: their scale and offset as a model, not a switch (issue 52).

Owners that measure one process with different gains, offsets and noise levels see
``y_k = m_k + c_k f(x) + ε_k``, ``ε_k ~ N(0, σ_k²)``. Today's ``transforms="auto"`` either standardises
everyone by one federated mean and sd or, when the owners' log-sd spread exceeds ln 2, each owner by
its own: a threshold that flips between split seeds of one population. Here the owners' scale is a
model: each owner standardised by its own mean and sd (so every owner starts from the same units),
then its outputscale, noise and mean offset trained as its personal hyper-parameters
(``FGPR(personal=("scale",))``, :mod:`fedgp.strategies.personal`), the lengthscales shared. In the
data's units owner k's mean, outputscale and noise are ``(ȳ_k + s_k μ_k, s_k² a_k, s_k² σ_k²)``,
``ȳ_k`` and ``s_k`` its own mean and sd, ``μ_k, a_k, σ_k²`` its personal values: the family
holds "one federated sd" and "each owner's own sd" as points, so no choice is made and none flips;
the data place each owner by maximum likelihood.

The yardstick of each objective is its central optimum
(:func:`fedgp.experiments.convergence.central_personal_optimum`: L-BFGS on
the pooled sum of the owners' log marginal likelihoods, each owner its own personal values).
``benchmarks/owner_scale.py`` runs the study; its table is ``results/owner_scale.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import gpytorch
import numpy as np
import pandas as pd
import torch

from fedgp.data import ClientData, Federation
from fedgp.experiments.convergence import central_personal_optimum, summed_personal_log_likelihood
from fedgp.models.posterior import condition_client, prediction_metrics
from fedgp.models.spec import GPSpec
from fedgp.run import Evaluate, Progress, fit
from fedgp.strategies import FGPR
from fedgp.strategies.personal import personal_names
from fedgp.strategies.shrinkage import evidence_widths
from fedgp.transforms import Standardize, Transforms

__all__ = [
    "GAINS",
    "NOISES",
    "Candidate",
    "CANDIDATES",
    "FEDERATED_SD",
    "OWN_SD",
    "scale_spec",
    "gain_owners",
    "group_of",
    "owner_metrics",
    "candidate_run",
    "auto_choice",
    "scale_study",
]

#: The gains of :func:`gain_owners`' owner groups, 10x apart.
GAINS = (1.0, 10.0)
#: The noise standard deviations of :func:`gain_owners`' owner groups, 10x apart.
NOISES = (0.05, 0.5)


def scale_spec() -> GPSpec:
    """``ScaleKernel(RBFKernel())`` with a ``ConstantMean``: the mean offset is a hyper-parameter an
    owner can keep for itself."""
    return GPSpec(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), gpytorch.means.ConstantMean())


def _latent(
    population: int, lengthscale: float = 0.2, features: int = 200
) -> Callable[[np.ndarray], np.ndarray]:
    """One draw of a unit-variance GP with an RBF kernel of ``lengthscale`` on the line (random
    Fourier features, fixed by ``population``)."""
    rng = np.random.default_rng([population, 7])
    omega = rng.standard_normal(features) / lengthscale
    phase = rng.uniform(0, 2 * math.pi, features)
    weight = rng.standard_normal(features) * math.sqrt(2.0 / features)
    return lambda x: np.cos(np.outer(x, omega) + phase) @ weight


def gain_owners(
    population: int = 0, split: int = 0, per_group: int = 3, n: int = 60, gains=GAINS, noises=NOISES
) -> Federation:
    """Owners measuring one GP draw ``f`` on [0, 1] as ``m_k + c_k f(x) + σ_k ε``, one group per gain
    ``c`` in ``gains`` and noise sd ``σ`` in ``noises`` (``per_group`` owners each), offsets
    ``m_k = c_k U(-2, 2)``. ``population`` fixes f, the owners' inputs, offsets and noise draws;
    ``split`` only which quarter of each owner's rows is held out for testing. Owner ids name their
    group: ``"gain10-noise0.05-2"``."""
    f = _latent(population)
    rng = np.random.default_rng([population, 11])
    drawn = []
    for gain in gains:
        for noise in noises:
            for i in range(per_group):
                x = rng.uniform(0, 1, n)
                y = gain * rng.uniform(-2, 2) + gain * f(x) + noise * rng.standard_normal(n)
                drawn.append((f"gain{gain:g}-noise{noise:g}-{i}", x, y))
    splitter = np.random.default_rng([split, 13])
    owners = []
    for owner, x, y in drawn:
        order = splitter.permutation(n)
        test, train = order[: n // 4], order[n // 4 :]
        owners.append(ClientData(x[train, None], y[train], id=owner, X_test=x[test, None], y_test=y[test]))
    return Federation(owners)


def group_of(owner: str) -> str:
    """An owner's group: its id without the trailing index (``"gain10-noise0.05"``)."""
    return str(owner).rsplit("-", 1)[0]


# -- the yardstick: each objective's central optimum --------------------------------------------------


def owner_metrics(spec, states, transformed, offsets, scales, federation) -> pd.DataFrame:
    """Each owner's test RMSE, NLL and 95 % coverage in the data's units, owner k conditioning
    ``states[k]`` on its own (transformed) training rows, its predictions mapped back by its outcome
    map ``y = offsets[k] + scales[k] y'``."""
    spec = spec.for_data(list(transformed))
    rows = []
    for k, (state, client, raw) in enumerate(zip(states, transformed, federation)):
        p = condition_client(spec, state, client)
        s, o = float(scales[k]), float(offsets[k])
        p = type(p)(p.mean * s + o, p.variance_f * s * s, p.variance_y * s * s)
        m = prediction_metrics([p], [raw.y_test.to(torch.float64)])
        rows.append({"client": raw.id, **{name: float(m[name][0]) for name in ("rmse", "nll", "coverage95")}})
    return pd.DataFrame(rows)


# -- the candidates ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One way to treat the owners' scale: the run's transforms and the names each owner keeps
    (``None``: no federation, each owner alone at its own optimum); ``shrink="evidence"``: the
    personal values shrunk towards the server's by widths the evidence chooses from a first,
    unshrunk fit (:func:`fedgp.strategies.shrinkage.evidence_widths`)."""

    transforms: object
    personal: tuple[str, ...] | None = ()
    shrink: str | None = None


#: One federated mean and sd for every owner.
FEDERATED_SD = Transforms(outcome=Standardize())
#: Each owner's own mean and sd: the units the scale model's personal values start from.
OWN_SD = Transforms(outcome=Standardize(local=True))

#: The ways the study compares, by name.
CANDIDATES: Mapping[str, Candidate] = {
    "auto (fit's default)": Candidate("auto"),
    "one federated sd": Candidate(FEDERATED_SD),
    "each owner's own sd": Candidate(OWN_SD),
    "federated sd, personal noise": Candidate(FEDERATED_SD, ("noise",)),
    "own sd, personal noise": Candidate(OWN_SD, ("noise",)),
    "own sd, personal scale": Candidate(OWN_SD, ("scale",)),
    "own sd, personal scale, shrunk": Candidate(OWN_SD, ("scale",), shrink="evidence"),
    "owners alone": Candidate(OWN_SD, None),
}


def candidate_run(
    federation: Federation,
    candidate: Candidate,
    rounds: int = 100,
    seed: int = 0,
    spec: GPSpec | None = None,
    optimum: bool = True,
    restarts: int = 3,
) -> tuple[pd.DataFrame, dict]:
    """Fit one candidate (FGPR's defaults, ``rounds`` rounds) and measure each owner's test metrics,
    beside (``optimum``) those at the central optimum of the same objective, with the run's gap to
    that optimum in nats per owner. "Owners alone" is measured at its optimum only; a shrunk
    candidate's objective has the prior, so it is measured learned only, its widths in ``info``."""
    spec = spec or scale_spec()
    strategy = FGPR(personal=candidate.personal or ())
    rounds = 1 if candidate.personal is None else rounds  # alone: the run only learns the transform
    quiet = [Evaluate(every=0), Progress(False)]
    result = fit(spec, federation, strategy, rounds=rounds, seed=seed, transforms=candidate.transforms,
                 callbacks=quiet)  # fmt: skip
    clients, offsets, scales = result.transform.apply_all(list(federation))
    built = result.spec
    names = (
        frozenset(p.name for p in built.params)
        if candidate.personal is None
        else personal_names(built, candidate.personal, "scale_study")
    )
    info = {"outcome": result.transforms.get("outcome", "")}
    if candidate.shrink == "evidence":
        states = [result.client_state(k) for k in range(len(federation))]
        shrink = evidence_widths(built, states, clients, names)
        strategy = FGPR(personal=candidate.personal, shrink=shrink)
        result = fit(spec, federation, strategy, rounds=rounds, seed=seed, transforms=candidate.transforms,
                     callbacks=quiet)  # fmt: skip
        info["widths"] = "; ".join(f"{name.rsplit('.', 1)[-1]} {w:.3g}" for name, w in shrink.widths)
        optimum = False
    if candidate.personal is None:  # independent owners: each one's optimum on its own
        alone = [central_personal_optimum(built, [c], names, restarts, seed)[0][0] for c in clients]
        at_optimum = owner_metrics(built, alone, clients, offsets, scales, federation)
        return at_optimum.assign(at_optimum=True), {**info, "gap_per_owner": 0.0}
    learned = result.evaluate()[["client", "rmse", "nll", "coverage95"]]
    if not optimum:
        return learned.assign(at_optimum=False), {**info, "gap_per_owner": math.nan}
    best, value = central_personal_optimum(built, clients, names, restarts, seed)
    at_optimum = owner_metrics(built, best, clients, offsets, scales, federation)
    states = [result.client_state(k) for k in range(len(federation))]
    gap = (value - summed_personal_log_likelihood(built, states, clients)) / len(clients)
    both = pd.concat([learned.assign(at_optimum=False), at_optimum.assign(at_optimum=True)])
    return both, {**info, "gap_per_owner": gap}


def auto_choice(federation: Federation, spec: GPSpec | None = None) -> str:
    """The candidate today's ``transforms="auto"`` picks for ``federation``: "one federated sd" or
    "each owner's own sd" (:func:`fedgp.transforms.auto_outcome`, read from a one-round fit)."""
    result = fit(spec or scale_spec(), federation, FGPR(), rounds=1, seed=0, transforms="auto",
                 callbacks=[Evaluate(every=0), Progress(False)])  # fmt: skip
    return "each owner's own sd" if result.transform.y_local else "one federated sd"


def scale_study(
    federations: Mapping[str, Callable[[int], Federation]],
    seeds: Sequence[int] = (0, 1, 2),
    candidates: Mapping[str, Candidate] | None = None,
    rounds: int = 100,
    restarts: int = 3,
    log: Callable[[str], None] = lambda line: None,
) -> pd.DataFrame:
    """One row per (federation, split seed, candidate, owner, learned or central optimum). The
    ``"auto"`` candidate is not fitted again: its rows are those of the candidate it picks."""
    frames = []
    for name, make in federations.items():
        for seed in seeds:
            federation = make(seed)
            done = {}
            for label, candidate in (candidates or CANDIDATES).items():
                if candidate.transforms == "auto":
                    continue
                owners, info = candidate_run(federation, candidate, rounds, seed, restarts=restarts)
                done[label] = owners.assign(federation=name, seed=seed, candidate=label, **info)
                log(f"{name} seed {seed}: {label}")
            auto = [label for label, c in (candidates or CANDIDATES).items() if c.transforms == "auto"]
            picked = auto_choice(federation) if auto else None
            frames += [*done.values(), *(done[picked].assign(candidate=label) for label in auto)]
    return pd.concat(frames, ignore_index=True)
