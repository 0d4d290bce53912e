"""Models and strategies by name: what ``fedgp fit`` and ``FederatedGPRegressor`` accept as strings.

A name stands for GPyTorch modules or a fedgp strategy with its defaults, so that a command line
or a scikit-learn parameter grid can say ``kernel="matern52"`` or ``strategy="ifca"``. Everything
a name gives can be written out in Python, and both entry points also take the objects themselves.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch

from fedgp.errors import InputError
from fedgp.models.spec import GPSpec
from fedgp.strategies.base import Strategy
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.ifca import IFCA

__all__ = ["KERNELS", "MEANS", "STRATEGIES", "make_kernel", "make_mean", "make_spec", "make_strategy"]

#: Kernel names: the base kernel inside a ``ScaleKernel`` (its outputscale is learned too).
KERNELS = {
    "rbf": lambda ard: gpytorch.kernels.RBFKernel(ard_num_dims=ard),
    "matern12": lambda ard: gpytorch.kernels.MaternKernel(nu=0.5, ard_num_dims=ard),
    "matern32": lambda ard: gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=ard),
    "matern52": lambda ard: gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=ard),
}


def _linear_mean(d: int) -> gpytorch.means.LinearMean:
    """``LinearMean(d)`` starting at zero weights and bias. GPyTorch draws them from torch's global
    generator, which torch seeds differently in every process: the same ``fedgp fit --mean linear
    --seed 0`` would start (and end) elsewhere in each run."""
    mean = gpytorch.means.LinearMean(d)
    with torch.no_grad():
        mean.weights.zero_()
        mean.bias.zero_()
    return mean


#: Mean names; ``linear`` is a linear mean with a bias (``LinearMean(d)``, starting at zero).
MEANS = {
    "constant": lambda d: gpytorch.means.ConstantMean(),
    "zero": lambda d: gpytorch.means.ZeroMean(),
    "linear": _linear_mean,
}
#: Strategy names: FGPR (one shared prior) and IFCA (``num_clusters`` shared priors).
STRATEGIES = {"fgpr": FGPR, "ifca": IFCA}


def _pick(kind: str, name: Any, table: dict, instead: str) -> Any:
    if not isinstance(name, str) or name.lower() not in table:
        raise InputError(f"{kind} {name!r}: use one of {', '.join(table)}, or pass {instead}")
    return table[name.lower()]


def make_kernel(kernel: str | gpytorch.kernels.Kernel, d: int, ard: bool = True) -> gpytorch.kernels.Kernel:
    """``ScaleKernel(base)`` for a kernel name (one lengthscale per input with ``ard``); a GPyTorch
    kernel is returned as it is."""
    if isinstance(kernel, gpytorch.kernels.Kernel):
        return kernel
    return gpytorch.kernels.ScaleKernel(
        _pick("kernel", kernel, KERNELS, "a GPyTorch kernel")(d if ard else None)
    )


def make_mean(mean: str | gpytorch.means.Mean, d: int) -> gpytorch.means.Mean:
    """The GPyTorch mean called ``mean``; a GPyTorch mean is returned as it is."""
    if isinstance(mean, gpytorch.means.Mean):
        return mean
    return _pick("mean", mean, MEANS, "a GPyTorch mean")(d)


def make_spec(
    kernel: str | gpytorch.kernels.Kernel = "rbf",
    mean: str | gpytorch.means.Mean = "constant",
    d: int = 1,
    ard: bool = True,
) -> GPSpec:
    """A :class:`~fedgp.GPSpec` from names (or modules) for ``d`` input features."""
    if not isinstance(d, int) or d < 1:
        raise InputError(f"d must be a positive number of input features, got {d!r}")
    return GPSpec(kernel=make_kernel(kernel, d, ard), mean=make_mean(mean, d))


def make_strategy(strategy: str | Strategy = "fgpr", **settings: Any) -> Strategy:
    """The strategy called ``strategy`` with ``settings`` (those given as ``None`` keep the
    strategy's defaults); a :class:`~fedgp.strategies.Strategy` is returned as it is (then
    ``settings`` must be empty)."""
    given = {k: v for k, v in settings.items() if v is not None}
    if isinstance(strategy, Strategy):
        if given:
            raise InputError(
                f"settings {sorted(given)} apply to a strategy given by name, not to {strategy!r}"
            )
        return strategy
    cls = _pick("strategy", strategy, STRATEGIES, "a fedgp.strategies.Strategy")
    if "num_clusters" in given and cls is not IFCA:
        raise InputError(f"num_clusters (--clusters) applies to ifca, not to {strategy!r}")
    return cls(**given)
