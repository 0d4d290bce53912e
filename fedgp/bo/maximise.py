"""Maximising a function one can differentiate and evaluate anywhere (a Fourier-feature draw):
the best of a design of points, polished by L-BFGS-B with torch's gradient."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedgp.bo.owner import DTYPE

__all__ = ["polish", "maximise"]


def polish(
    f: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, bounds: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """``(x, f(x))``: L-BFGS-B from ``start`` (``d``) inside ``bounds``; ``start`` itself when the
    search ends lower."""
    from scipy.optimize import minimize

    def negative(x):
        X = torch.as_tensor(x, dtype=DTYPE).unsqueeze(0).requires_grad_(True)
        value = -f(X).sum()
        value.backward()
        return float(value.detach()), X.grad[0].numpy()

    box = list(zip(bounds[0].tolist(), bounds[1].tolist()))
    res = minimize(negative, start.numpy(), jac=True, bounds=box, method="L-BFGS-B")
    at_start = float(f(start.unsqueeze(0)))
    if -float(res.fun) < at_start:
        return start, at_start
    return torch.as_tensor(res.x, dtype=DTYPE).clamp(bounds[0], bounds[1]), -float(res.fun)


def maximise(
    f: Callable[[torch.Tensor], torch.Tensor], design: torch.Tensor, bounds: torch.Tensor, starts: int = 1
) -> tuple[torch.Tensor, float]:
    """``(x, f(x))``: the best of the ``design`` points (``n x d``), polished from its ``starts`` best."""
    values = f(design).detach()
    best = (design[int(values.argmax())], float(values.max()))
    for i in values.topk(min(starts, len(values))).indices.tolist():
        x, value = polish(f, design[i], bounds)
        if value > best[1]:
            best = (x, value)
    return best
