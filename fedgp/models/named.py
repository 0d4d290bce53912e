"""Kernels and means by name: what ``GPSpec(kernel="matern52")``, ``fedgp fit --kernel``, the
scikit-learn estimator and the Flower app's run config accept as strings.

A name stands for GPyTorch modules that can be written out in Python; it is built for the data's
input width once that is known (:meth:`fedgp.GPSpec.for_inputs`), so that a named kernel with one
lengthscale per feature fits any table.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch

from fedgp.errors import InputError

__all__ = ["KERNELS", "MEANS", "make_kernel", "make_mean", "needs_width"]

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


def pick(kind: str, name: Any, table: dict, instead: str) -> Any:
    """``table[name]`` (any case), or an error listing the names."""
    if not isinstance(name, str) or name.lower() not in table:
        raise InputError(f"{kind} {name!r}: use one of {', '.join(table)}, or pass {instead}")
    return table[name.lower()]


def make_kernel(kernel: str | gpytorch.kernels.Kernel, d: int, ard: bool = True) -> gpytorch.kernels.Kernel:
    """``ScaleKernel(base)`` for a kernel name (one lengthscale per input with ``ard``); a GPyTorch
    kernel is returned as it is."""
    if isinstance(kernel, gpytorch.kernels.Kernel):
        return kernel
    return gpytorch.kernels.ScaleKernel(
        pick("kernel", kernel, KERNELS, "a GPyTorch kernel")(d if ard else None)
    )


def make_mean(mean: str | gpytorch.means.Mean, d: int) -> gpytorch.means.Mean:
    """The GPyTorch mean called ``mean``; a GPyTorch mean is returned as it is."""
    if isinstance(mean, gpytorch.means.Mean):
        return mean
    return pick("mean", mean, MEANS, "a GPyTorch mean")(d)


def needs_width(kernel: Any, mean: Any, ard: bool) -> bool:
    """Whether modules given by these names depend on the inputs' width (an ARD kernel, a linear mean)."""
    return (isinstance(kernel, str) and bool(ard)) or (isinstance(mean, str) and mean.lower() == "linear")
