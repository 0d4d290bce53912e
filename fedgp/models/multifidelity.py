"""Centralised multi-fidelity baselines in GPyTorch: recursive AR1 (Kennedy–O'Hagan) and NARGP.

Both see every fidelity level's data (they are *not* federated); they are the references FGPR is
compared with in Yue & Kontar's Table 1. Levels are given lowest fidelity first as ``(X, y)``
pairs; each level's GP is fitted by converged exact MLE (:func:`mle_with_restarts`), and the
level above uses the posterior mean of the level below as an extra input column.

* :class:`AR1` — ``f_t(x) = ρ_t f_{t−1}(x) + δ_t(x)`` with ``δ_t ~ GP(c_t, k_t)``, fitted
  recursively (Le Gratiet & Garnier 2014): ``ρ_t`` and ``c_t`` are the coefficients of a mean
  function ``ρ_t μ_{t−1}(x) + c_t``, learned jointly with ``k_t`` by MLE. Predictive mean is that
  GP's posterior mean; predictive variance ``ρ_t² σ²_{t−1}(x) + σ²_δ(x)``.
* :class:`NARGP` — Perdikaris et al. (2017): ``f_t(x) = g_t(x, f_{t−1}(x))`` with the kernel
  ``k_ρ(x, x') k_f(f, f') + k_δ(x, x')`` on ``z = [x, f]``; prediction propagates the lower
  level's uncertainty by Monte Carlo and matches moments. It is NARGP, not a deep GP.

The multi-fidelity deep GP of Cutajar et al. (2019) is not implemented.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import gpytorch
import torch

from fedgp.errors import InputError, NotFittedError
from fedgp.models.mle import lbfgs, maximize_likelihood, perturbed_starts
from fedgp.models.posterior import Prediction, condition
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["rbf_spec", "mle_with_restarts", "AutoregressiveMean", "AR1", "NARGP"]

Levels = Sequence[tuple[torch.Tensor, torch.Tensor]]


def rbf_spec(d: int, ard: bool = True) -> GPSpec:
    """``ScaleKernel(RBF)`` (ARD over ``d`` inputs unless ``ard=False``), zero mean: the Table 1 model."""
    base = gpytorch.kernels.RBFKernel(ard_num_dims=d if ard else None)
    return GPSpec(kernel=gpytorch.kernels.ScaleKernel(base))


def mle_with_restarts(
    spec: GPSpec,
    datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    restarts: int = 4,
    seed: int = 0,
    init: HyperState | None = None,
    restart_scale: float = 1.0,
    max_iter: int = 200,
) -> tuple[HyperState, float]:
    """Type-II ML by L-BFGS from ``init`` and ``restarts`` other starts; the best wins.

    The first extra start is an *interpolating* one (noise 1e-3, every lengthscale 0.2, for
    inputs on the unit cube): the test functions here are noise-free, and from GPyTorch's default
    start (noise 0.69) L-BFGS often settles in the "everything is noise" optimum. The others
    perturb the raw values of ``init`` by ``N(0, restart_scale²)``. A start that fails (NaN, a
    matrix that cannot be factorised) is skipped.
    """
    start = spec.initial_state() if init is None else init
    starts = [start]
    if restarts:
        starts.append(_interpolating_start(spec, start))
    # The perturbed starts are mapped back to constrained values and then to raw ones again, as
    # they always were: the round trip is part of the reproduced Table 1 numbers.
    perturbed = perturbed_starts(spec, spec.to_raw(start), restarts - 1, seed, restart_scale)
    starts += [spec.from_raw(raw) for raw in perturbed]
    fit = maximize_likelihood(
        spec, datasets, [(spec.to_raw(s), partial(lbfgs, max_iter=max_iter)) for s in starts]
    )
    return fit.state, fit.value


def _interpolating_start(spec: GPSpec, start: HyperState) -> HyperState:
    values = {}
    for name in spec.trainable_names:
        if name.endswith("lengthscale"):
            values[name] = 0.2
        elif name.endswith("noise"):
            values[name] = 1e-3
    values = {k: torch.full_like(start[k], v) for k, v in values.items()}
    return HyperState({**dict(start), **values}, start.event_shapes)


class AutoregressiveMean(gpytorch.means.Mean):
    """``m(z) = ρ · z[..., -1] + c``: the last input column holds the lower level's posterior mean."""

    def __init__(self, rho: float = 1.0, constant: float = 0.0) -> None:
        super().__init__()
        self.register_parameter("rho", torch.nn.Parameter(torch.tensor(float(rho))))
        self.register_parameter("constant", torch.nn.Parameter(torch.tensor(float(constant))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rho * x[..., -1] + self.constant


def _check_levels(levels: Levels) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if len(levels) < 2:
        raise InputError(f"levels: a multi-fidelity model needs at least 2 levels, got {len(levels)}")
    out = []
    d = None
    for t, (X, y) in enumerate(levels):
        X = torch.as_tensor(X, dtype=torch.float64)
        y = torch.as_tensor(y, dtype=torch.float64)
        if X.dim() != 2 or y.dim() != 1 or X.shape[0] != y.shape[0]:
            raise InputError(
                f"levels[{t}]: need X (n, d) and y (n,), got {tuple(X.shape)} and {tuple(y.shape)}"
            )
        if X.shape[0] < 2:
            raise InputError(f"levels[{t}]: at least 2 points needed, got {X.shape[0]}")
        if not (torch.isfinite(X).all() and torch.isfinite(y).all()):
            raise InputError(f"levels[{t}]: X or y contains NaN or inf")
        if d is not None and X.shape[1] != d:
            raise InputError(f"levels[{t}]: {X.shape[1]} features, but levels[0] has {d}")
        d = X.shape[1]
        out.append((X, y))
    return out


def _as_inputs(X, d: int) -> torch.Tensor:
    X = torch.as_tensor(X, dtype=torch.float64)
    if X.dim() != 2 or X.shape[1] != d:
        raise InputError(f"X must have shape (n, {d}), got {tuple(X.shape)}")
    return X


class _Recursive:
    """Shared plumbing: per-level specs and states, fitted lowest level first."""

    def __init__(self, ard: bool = True, restarts: int = 4, seed: int = 0) -> None:
        if restarts < 0:
            raise InputError(f"restarts must be >= 0, got {restarts}")
        self.ard, self.restarts, self.seed = ard, restarts, seed

    def _fit_level(self, t: int, spec: GPSpec, X, y, init: HyperState | None = None) -> HyperState:
        state, _ = mle_with_restarts(
            spec, [(X, y)], restarts=self.restarts, seed=self.seed + 1000 * t, init=init
        )
        return state

    def _check_fitted(self) -> None:
        if not hasattr(self, "states_"):
            raise NotFittedError(f"{type(self).__name__} is not fitted yet; call fit(levels) first")


class AR1(_Recursive):
    """Recursive auto-regressive co-kriging (Kennedy & O'Hagan 2000; Le Gratiet & Garnier 2014).

    Args:
        ard: ARD lengthscales (one per input) in every level's RBF kernel.
        restarts: random MLE restarts per level (besides the default start).
        seed: seeds the restarts.

    After :meth:`fit`: ``states_`` (one :class:`HyperState` per level) and ``rho_`` (ρ_t for t ≥ 1).
    """

    def fit(self, levels: Levels) -> AR1:
        """Fit on ``[(X_low, y_low), ..., (X_high, y_high)]`` (lowest fidelity first)."""
        levels = _check_levels(levels)
        d = levels[0][0].shape[1]
        self.d_ = d
        self.levels_ = levels
        self._train_cache: dict[int, torch.Tensor] = {}
        self.specs_ = [rbf_spec(d, self.ard)]
        self.states_ = [self._fit_level(0, self.specs_[0], *levels[0])]
        for t in range(1, len(levels)):
            X, y = levels[t]
            below = self._predict(t - 1, X).mean
            # ρ starts at the least-squares slope of y on the level below, c at the intercept.
            A = torch.stack([below, torch.ones_like(below)], 1)
            rho0, c0 = torch.linalg.lstsq(A, y.unsqueeze(1)).solution.squeeze(1).tolist()
            kernel = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=d if self.ard else None, active_dims=tuple(range(d)))
            )
            spec = GPSpec(kernel=kernel, mean=AutoregressiveMean())
            init = spec.state({"mean_module.rho": rho0, "mean_module.constant": c0})
            self.specs_.append(spec)
            self.states_.append(self._fit_level(t, spec, torch.cat([X, below[:, None]], 1), y, init))
        self.rho_ = [float(s["mean_module.rho"]) for s in self.states_[1:]]
        return self

    def _predict(self, t: int, X: torch.Tensor) -> Prediction:
        X0, y0 = self.levels_[0]
        pred = condition(self.specs_[0], self.states_[0], X0, y0, X)
        for s in range(1, t + 1):
            Xs, ys = self.levels_[s]
            below_train = self._train_inputs(s)
            rho = self.states_[s]["mean_module.rho"]
            here = condition(
                self.specs_[s], self.states_[s], below_train, ys, torch.cat([X, pred.mean[:, None]], 1)
            )
            var_f = rho**2 * pred.variance_f + here.variance_f
            noise = here.variance_y - here.variance_f
            pred = Prediction(here.mean, var_f, var_f + noise)
        return pred

    def _train_inputs(self, s: int) -> torch.Tensor:
        if s not in self._train_cache:
            Xs = self.levels_[s][0]
            self._train_cache[s] = torch.cat([Xs, self._predict(s - 1, Xs).mean[:, None]], 1)
        return self._train_cache[s]

    def predict(self, X, level: int = -1) -> Prediction:
        """Predictive distribution of level ``level`` (default the highest) at ``X``."""
        self._check_fitted()
        t = range(len(self.levels_))[level]
        return self._predict(t, _as_inputs(X, self.d_))


class NARGP(_Recursive):
    """Nonlinear auto-regressive multi-fidelity GP (Perdikaris et al. 2017).

    Args:
        ard: ARD lengthscales over ``x`` in ``k_ρ`` and ``k_δ``.
        restarts: random MLE restarts per level.
        samples: Monte Carlo samples of the lower level used at prediction (the paper: 1,000).
        seed: seeds the restarts and the Monte Carlo draws.

    Training uses the lower level's posterior mean at the training inputs; prediction draws
    ``samples`` values of the lower level at each test input and matches moments:
    ``mean = E_s[μ_t(x, f_s)]``, ``var = E_s[σ²_t(x, f_s)] + Var_s[μ_t(x, f_s)]``.
    """

    def __init__(self, ard: bool = True, restarts: int = 4, samples: int = 100, seed: int = 0) -> None:
        super().__init__(ard, restarts, seed)
        if samples < 1:
            raise InputError(f"samples must be >= 1, got {samples}")
        self.samples = samples

    def _spec(self, d: int) -> GPSpec:
        x_dims = tuple(range(d))
        ard = d if self.ard else None
        # When f_t is nearly a function of f_{t-1} alone, MLE drives k_δ's outputscale to 0 and its
        # lengthscale to 0 as well (flat likelihood), which ends in NaN; a floor of 1e-4 stops that.
        floor = gpytorch.constraints.GreaterThan(1e-4)
        k_rho = gpytorch.kernels.RBFKernel(ard_num_dims=ard, active_dims=x_dims, lengthscale_constraint=floor)
        k_f = gpytorch.kernels.RBFKernel(active_dims=(d,), lengthscale_constraint=floor)
        k_delta = gpytorch.kernels.RBFKernel(
            ard_num_dims=ard, active_dims=x_dims, lengthscale_constraint=floor
        )
        kernel = gpytorch.kernels.ScaleKernel(k_rho * k_f) + gpytorch.kernels.ScaleKernel(k_delta)
        return GPSpec(kernel=kernel)

    def fit(self, levels: Levels) -> NARGP:
        """Fit on ``[(X_low, y_low), ..., (X_high, y_high)]`` (lowest fidelity first)."""
        levels = _check_levels(levels)
        d = levels[0][0].shape[1]
        self.d_ = d
        self.levels_ = levels
        self.specs_ = [rbf_spec(d, self.ard)]
        self.states_ = [self._fit_level(0, self.specs_[0], *levels[0])]
        self.train_inputs_ = [levels[0][0]]
        for t in range(1, len(levels)):
            X, y = levels[t]
            below = self._predict(t - 1, X, torch.Generator().manual_seed(self.seed + t)).mean
            Z = torch.cat([X, below[:, None]], 1)
            self.specs_.append(self._spec(d))
            self.train_inputs_.append(Z)
            self.states_.append(self._fit_level(t, self.specs_[t], Z, y))
        return self

    def _level(self, t: int, Z: torch.Tensor, chunk: int = 1000) -> Prediction:
        parts = [
            condition(
                self.specs_[t], self.states_[t], self.train_inputs_[t], self.levels_[t][1], Z[i : i + chunk]
            )
            for i in range(0, Z.shape[0], chunk)
        ]
        return Prediction(
            *(torch.cat([getattr(p, k) for p in parts]) for k in ("mean", "variance_f", "variance_y"))
        )

    def _predict(self, t: int, X: torch.Tensor, gen: torch.Generator) -> Prediction:
        pred = self._level(0, X)
        if t == 0:
            return pred
        n, S = X.shape[0], self.samples
        # One Monte Carlo chain per sample: f_0 ~ N(μ_0, σ²_0), then f_s | f_{s−1} level by level.
        draw = pred.mean + pred.variance_f.clamp_min(0).sqrt() * torch.randn(
            S, n, generator=gen, dtype=X.dtype
        )
        Xs = X.unsqueeze(0).expand(S, n, X.shape[1]).reshape(S * n, -1)
        for s in range(1, t + 1):
            here = self._level(s, torch.cat([Xs, draw.reshape(-1, 1)], 1))
            mean, var_f = here.mean.reshape(S, n), here.variance_f.reshape(S, n)
            if s < t:
                draw = mean + var_f.clamp_min(0).sqrt() * torch.randn(S, n, generator=gen, dtype=X.dtype)
        noise = float(self.states_[t]["likelihood.noise_covar.noise"])
        total_f = var_f.mean(0) + (mean.var(0, unbiased=False) if S > 1 else 0.0)
        return Prediction(mean.mean(0), total_f, total_f + noise)

    def predict(self, X, level: int = -1) -> Prediction:
        """Moment-matched predictive distribution of level ``level`` (default the highest) at ``X``."""
        self._check_fitted()
        t = range(len(self.levels_))[level]
        return self._predict(t, _as_inputs(X, self.d_), torch.Generator().manual_seed(self.seed + 7919))
