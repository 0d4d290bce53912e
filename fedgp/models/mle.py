"""Converged exact maximum likelihood: the centralised counterpart of FGPR, and a baseline.

Every type-II ML fit in fedgp (``fit_mle``, the multi-fidelity levels' ``mle_with_restarts``,
LocalGP/CentralGP's L-BFGS-then-Adam) is one call of :func:`maximize_likelihood`: a loop over
attempts, each a start and an optimiser, that skips the numerical failures and keeps the best (or
the first) finite fit. The objective is ``sum_k log p(y_k | X_k, θ)``: the *same* per-client
marginal likelihoods that FGPR's clients see, summed over all their data at once.

GPyTorch has no restart loop. BoTorch's ``fit_gpytorch_mll`` has one (``_fit_fallback``), but it
does not fit this use: its default closure for an exact GP calls BoTorch's
``Model.transform_inputs``; its restarts draw from the hyper-parameter priors, which our specs do
not have (without priors every attempt restarts from the same values); it evaluates one model on
its own training data (over a ``ModelListGP`` it fits each model separately), not one θ on the sum
of several datasets' likelihoods; and BoTorch is not a dependency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from linear_operator.utils.errors import NanError, NotPSDError

from fedgp.errors import MLEError
from fedgp.models.objective import minibatch_nll
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = [
    "MLEFit",
    "NUMERICAL_ERRORS",
    "adam",
    "fit_mle",
    "lbfgs",
    "maximize_likelihood",
    "perturbed_starts",
    "total_nll",
]

logger = logging.getLogger(__name__)

Datasets = Sequence[tuple[torch.Tensor, torch.Tensor]]
#: An optimiser run: ``optimizer(params, loss)`` minimises the zero-argument ``loss`` in place.
Optimizer = Callable[[list[torch.nn.Parameter], Callable[[], torch.Tensor]], None]
#: What a failed attempt raises (a non-finite likelihood or state is a failure too); an
#: eigendecomposition that does not converge (torch's LinAlgError) ends the attempt as well.
NUMERICAL_ERRORS: tuple[type[Exception], ...] = (NotPSDError, NanError, torch.linalg.LinAlgError)


@dataclass
class MLEFit:
    """The kept fit: its state, per-point NLL, the index of its attempt, and the failed attempts."""

    state: HyperState
    value: float
    attempt: int
    failures: list[str] = field(default_factory=list)


def sized(spec: GPSpec, datasets: Datasets) -> GPSpec:
    """``spec`` with its named modules (``GPSpec()``'s default kernel) built for the data's width."""
    datasets = list(datasets)
    return spec.for_inputs(datasets[0][0].shape[-1]) if datasets else spec


def total_nll(spec: GPSpec, state: HyperState, datasets: Datasets) -> float:
    """``-sum_k log p(y_k | X_k, θ) / sum_k n_k``: the per-point NLL of the pooled objective."""
    spec = sized(spec, datasets)
    model = spec.build()
    spec.load(model, state)
    with torch.no_grad():
        total = sum(float(minibatch_nll(model, X, y)) * len(y) for X, y in datasets)
    return total / sum(len(y) for _, y in datasets)


def _pooled_nll(model: torch.nn.Module, datasets: Datasets, n_total: int) -> torch.Tensor:
    return sum(minibatch_nll(model, X, y) * len(y) for X, y in datasets) / n_total


def lbfgs(params: list[torch.nn.Parameter], loss: Callable[[], torch.Tensor], max_iter: int = 200) -> None:
    """Torch's L-BFGS with a strong Wolfe line search, one ``step`` of up to ``max_iter`` iterations."""
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        value = loss()
        value.backward()
        return value

    optimizer.step(closure)


def adam(
    params: list[torch.nn.Parameter], loss: Callable[[], torch.Tensor], steps: int = 300, lr: float = 0.05
) -> None:
    """``steps`` full-batch Adam steps: slower than L-BFGS, but no line search to step into NaN."""
    optimizer = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()


def maximize_likelihood(
    spec: GPSpec,
    datasets: Datasets,
    attempts: Iterable[tuple[HyperState, Optimizer]],
    *,
    first_success: bool = False,
    caught: tuple[type[Exception], ...] = NUMERICAL_ERRORS,
) -> MLEFit:
    """Maximise the summed exact marginal likelihood of ``datasets`` once per attempt.

    Each attempt is ``(raw start, optimizer)``: a fresh model is loaded with the raw (unconstrained)
    values and the optimizer minimises the per-point NLL over the trainable parameters. An attempt
    that raises one of ``caught`` or ends with a non-finite NLL or state is recorded in
    ``failures`` and skipped. The lowest NLL wins (the earliest on ties); with ``first_success``
    the loop stops at the first finite fit (a fallback chain rather than restarts).
    """
    datasets = [(X.to(spec.dtype), y.to(spec.dtype)) for X, y in datasets]
    n_total = sum(len(y) for _, y in datasets)
    best: MLEFit | None = None
    failures: list[str] = []
    for index, (raw, optimizer) in enumerate(attempts):
        model = spec.build()
        spec.load_raw(model, raw)
        params = [model.get_parameter(p.raw_name) for p in spec.params if p.trainable]
        try:
            optimizer(params, partial(_pooled_nll, model, datasets, n_total))
            state = spec.read(model)
            value = total_nll(spec, state, datasets)
        except caught as err:
            failures.append(f"attempt {index}: {type(err).__name__}: {str(err)[:80]}")
            logger.debug("MLE %s", failures[-1])
            continue
        if not (np.isfinite(value) and all(bool(torch.isfinite(v).all()) for v in state.values())):
            failures.append(f"attempt {index}: non-finite NLL or state (NLL {value})")
            logger.debug("MLE %s", failures[-1])
            continue
        if best is None or value < best.value:
            best = MLEFit(state, value, index)
        if first_success:
            break
    if best is None:
        raise MLEError(f"every MLE attempt failed: {failures[:3]}")
    best.failures = failures
    return best


def perturbed_starts(spec: GPSpec, raw: HyperState, count: int, seed: int, scale: float) -> list[HyperState]:
    """``count`` raw starts: ``raw`` with ``N(0, scale²)`` added to each trainable value, drawn in
    order from one numpy generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    return [
        HyperState(
            {
                k: v + scale * torch.from_numpy(rng.standard_normal(tuple(v.shape))).to(v.dtype)
                if spec.param(k).trainable
                else v
                for k, v in raw.items()
            },
            raw.event_shapes,
        )
        for _ in range(max(count, 0))
    ]


def fit_mle(
    spec: GPSpec,
    datasets: Datasets,
    *,
    restarts: int = 0,
    max_iter: int = 200,
    seed: int = 0,
    init: HyperState | None = None,
    restart_scale: float = 1.0,
) -> tuple[HyperState, float]:
    """Type-II ML by L-BFGS from ``init`` (default the spec's initial state) and from ``restarts``
    random points (raw values perturbed by ``N(0, restart_scale²)``); returns the best state and
    its per-point NLL. With one dataset it is the ordinary type-II MLE."""
    spec = sized(spec, datasets)
    start = spec.to_raw(spec.initial_state() if init is None else init)
    starts = [start, *perturbed_starts(spec, start, restarts, seed, restart_scale)]
    fit = maximize_likelihood(spec, datasets, [(s, partial(lbfgs, max_iter=max_iter)) for s in starts])
    return fit.state, fit.value
