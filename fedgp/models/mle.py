"""Converged exact maximum likelihood: the centralised counterpart of FGPR, and a baseline.

``fit_mle`` maximises ``sum_k log p(y_k | X_k, θ)`` — the sum of the *same* per-client marginal
likelihoods that FGPR's clients see, on all their data at once — with L-BFGS (torch's, strong
Wolfe line search) and random restarts. With one dataset it is the ordinary type-II MLE.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from linear_operator.utils.errors import NotPSDError

from fedgp.models.objective import minibatch_nll
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["fit_mle", "total_nll"]


def total_nll(
    spec: GPSpec, state: HyperState, datasets: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> float:
    """``-sum_k log p(y_k | X_k, θ) / sum_k n_k``: the per-point NLL of the pooled objective."""
    model = spec.build()
    spec.load(model, state)
    with torch.no_grad():
        total = sum(float(minibatch_nll(model, X, y)) * len(y) for X, y in datasets)
    return total / sum(len(y) for _, y in datasets)


def fit_mle(
    spec: GPSpec,
    datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    restarts: int = 0,
    max_iter: int = 200,
    seed: int = 0,
    init: HyperState | None = None,
    restart_scale: float = 1.0,
) -> tuple[HyperState, float]:
    """Maximise the summed exact marginal likelihood of ``datasets`` over the trainable parameters.

    Starts from ``init`` (default the spec's initial state), then from ``restarts`` random points
    (raw values perturbed by ``N(0, restart_scale²)``); returns the best state and its per-point NLL.
    """
    datasets = [(X.to(spec.dtype), y.to(spec.dtype)) for X, y in datasets]
    n_total = sum(len(y) for _, y in datasets)
    start = spec.initial_state() if init is None else init
    rng = np.random.default_rng(seed)
    best: tuple[HyperState, float] | None = None
    failures = []
    for attempt in range(restarts + 1):
        raw = spec.to_raw(start)
        if attempt:
            raw = HyperState(
                {
                    k: v
                    + (
                        restart_scale * torch.from_numpy(rng.standard_normal(tuple(v.shape)))
                        if spec.param(k).trainable
                        else 0.0
                    )
                    for k, v in raw.items()
                },
                raw.event_shapes,
            )
        model = spec.build()
        spec.load_raw(model, raw)
        params = [model.get_parameter(p.raw_name) for p in spec.params if p.trainable]
        optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

        def closure(optimizer=optimizer, model=model):
            optimizer.zero_grad()
            loss = sum(minibatch_nll(model, X, y) * len(y) for X, y in datasets) / n_total
            loss.backward()
            return loss

        try:
            optimizer.step(closure)
            state = spec.read(model)
            value = total_nll(spec, state, datasets)
        except NotPSDError as err:
            failures.append(str(err))
            continue
        if np.isfinite(value) and (best is None or value < best[1]):
            best = (state, value)
    if best is None:
        raise RuntimeError(f"every MLE attempt failed to factorise: {failures[:3]}")
    return best
