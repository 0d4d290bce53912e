"""Shrinkage of personal hyper-parameters: owner k's value ``c + δ_k``, its offset ``δ_k ~ N(0, w²)``.

Personal values fitted on a few points follow those points too closely (an owner with 7 rows fits
its own outputscale and noise), and nothing pulls them towards the others'. Shrinkage is a
hierarchical prior, in GPyTorch's raw (unconstrained) values, where the local steps are taken:
owner k's raw value of a personal hyper-parameter is ``c + δ_k``, with

- ``c`` the server's value of that hyper-parameter, shared: every owner starts from it, trains it on
  its own likelihood and replies it, and the server averages it as it averages the lengthscale. A
  reply reveals what any shared hyper-parameter's does: a step of the owner's likelihood at its own
  value, never the value ``δ_k`` itself;
- ``δ_k`` the owner's offset, kept (:mod:`fedgp.strategies.memory`) and never replied, under the
  prior ``N(0, w²)``: each round, after the local steps on its likelihood, the owner takes the
  prior's proximal step (exact for the quadratic), ``δ ← δ / (1 + η / (w² n_k))``, ``η`` the local
  learning rate times the local steps and ``n_k`` its points: the prior counts once per owner in
  the summed objective ``Σ_k [log p(y_k | θ, c + δ_k) + log N(δ_k; 0, w²)]``, as a per-point loss.

The width ``w`` spans the two fits: ``w = 0`` is the shared fit (the hyper-parameter is not
personal; as ``w → 0`` the offsets vanish and the steps become the shared fit's), ``w = None``
(infinite) today's personal fit (the offset is free and ``c`` is not identified, so it stays at
the spec's initial value; the fit is ``FGPR(personal=...)`` without shrinkage, exactly).

The width is chosen by the data through the evidence of the second level (:func:`evidence_width`):
each owner's personal fit ``φ̂_k`` and its Laplace variance ``s_k²`` (the inverse Hessian of its own
negative log likelihood, :func:`laplace_moments`) make ``φ̂_k ~ N(c, w² + s_k²)``; ``c`` and ``w``
maximise its likelihood, from four sums over the owners per candidate width
(:func:`evidence_statistics`; summed fields, so under secure aggregation the server sees only the
sums). The argmax of a smooth curve moves by a grid step when the split moves a little: no
threshold that flips.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.messages import Configurable
from fedgp.models.objective import exact_settings, minibatch_nll
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.memory import ClientMemory
from fedgp.strategies.personal import personal_names

__all__ = [
    "Shrinkage",
    "shrink_start",
    "shrink_trained",
    "OFFSET",
    "GRID",
    "prior_penalty",
    "prior_gradient",
    "proximal",
    "laplace_moments",
    "evidence_statistics",
    "evidence_curve",
    "evidence_width",
]

#: The memory key prefix under which an owner keeps its raw offsets ``δ_k``.
OFFSET = "offset/"
#: The candidate widths of :func:`evidence_width` (raw units): 0 and 81 log-spaced from 1e-3 to 10.
GRID = torch.cat([torch.zeros(1, dtype=torch.float64), torch.logspace(-3, 1, 81, dtype=torch.float64)])


@dataclass(frozen=True)
class Shrinkage(Configurable):
    """The prior's widths (raw units): ``width`` for every personal hyper-parameter, ``widths`` per
    name (a state name, raw name or alias of :mod:`fedgp.strategies.personal`), overriding it.
    ``0``: the hyper-parameter is shared; ``None``: no prior (today's personal fit)."""

    width: float | None = None
    widths: tuple[tuple[str, float | None], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.widths, Mapping):
            object.__setattr__(self, "widths", tuple(self.widths.items()))
        object.__setattr__(self, "widths", tuple(tuple(pair) for pair in self.widths))
        for name, value in (("width", self.width), *self.widths):
            if not isinstance(name, str):
                raise InputTypeError(f"Shrinkage: a width's name must be a string, got {name!r}")
            if value is not None and not (isinstance(value, int | float) and value >= 0 and value < math.inf):
                raise InputError(
                    f"Shrinkage: the width of {name!r} must be >= 0 and finite, or None, got {value!r}"
                )

    def resolve(self, spec: GPSpec, personal: frozenset[str]) -> dict[str, float | None]:
        """Each personal state name's width (``widths`` by name, else ``width``); a name in ``widths``
        that is no personal hyper-parameter is refused."""
        out = dict.fromkeys(personal, self.width)
        for name, value in self.widths:
            found = personal_names(spec, (name,), "Shrinkage")
            if not found <= personal:
                raise InputError(
                    f"Shrinkage: widths names {name!r}, which is not personal here "
                    f"(personal: {sorted(personal)})"
                )
            out.update(dict.fromkeys(found, value))
        return out


def prior_penalty(offsets: torch.Tensor, width: float, n: torch.Tensor) -> torch.Tensor:
    """The prior's per-point loss ``δ² / (2 w² n)`` per owner (summed over a value's elements):
    ``-log N(δ; 0, w²) / n`` up to its constant."""
    per = offsets.reshape(len(offsets), -1) ** 2 / (2 * width**2)
    return per.sum(-1) / n.to(offsets.dtype)


def prior_gradient(offsets: torch.Tensor, width: float, n: torch.Tensor) -> torch.Tensor:
    """:func:`prior_penalty`'s gradient in the offsets: ``δ / (w² n)``."""
    shape = (len(offsets),) + (1,) * (offsets.dim() - 1)
    return offsets / (width**2 * n.to(offsets.dtype).reshape(shape))


def proximal(
    offsets: torch.Tensor, width: float, n: torch.Tensor, step: float | torch.Tensor
) -> torch.Tensor:
    """The prior's proximal step ``argmin_δ' penalty(δ') + |δ' - δ|² / (2 step)`` per owner:
    ``δ / (1 + step / (w² n))`` (``0`` at ``w = 0``); ``step`` one per owner or one for all."""
    if width == 0:
        return torch.zeros_like(offsets)
    shape = (len(offsets),) + (1,) * (offsets.dim() - 1)
    step = torch.as_tensor(step, dtype=offsets.dtype)
    step = step.reshape(shape) if step.dim() else step
    return offsets / (1 + step / (width**2 * n.to(offsets.dtype).reshape(shape)))


def shrink_start(spec: GPSpec, start: HyperState, shrunk: Iterable[str], memory: ClientMemory) -> HyperState:
    """``start`` (the broadcast ``c``, one row per owner) with each shrunk name at ``c + δ_k`` (raw)."""
    values = dict(start)
    for name in shrunk:
        p = spec.param(name)
        offset = memory.get(OFFSET + name, torch.zeros_like(start[name]))
        values[name] = p.transform(p.inverse_transform(start[name]) + offset)
    return HyperState(values, start.event_shapes)


def shrink_trained(
    spec: GPSpec,
    start: HyperState,
    trained: HyperState,
    widths: Mapping[str, float],
    memory: ClientMemory,
    sizes: torch.Tensor,
    step: float | torch.Tensor,
) -> HyperState:
    """After the local steps from ``c + δ_k`` to ``trained``: the step ``Δ`` (raw) is a step of the
    likelihood in ``c`` and in ``δ_k`` alike. The reply's ``c + Δ`` (returned, per owner); kept
    ``δ_k ← prox(δ_k + Δ)``."""
    values = dict(trained)
    for name, width in widths.items():
        p = spec.param(name)
        c = p.inverse_transform(start[name])
        offset = memory.get(OFFSET + name, torch.zeros_like(c))
        moved = p.inverse_transform(trained[name]) - (c + offset)
        memory.put(OFFSET + name, proximal(offset + moved, width, sizes, step).to(torch.float64))
        values[name] = p.transform(c + moved)
    return HyperState(values, trained.event_shapes)


# -- the width chosen by the evidence ---------------------------------------------------------------


def laplace_moments(
    spec: GPSpec, state: HyperState, X: torch.Tensor, y: torch.Tensor, names: Sequence[str]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An owner's raw values of ``names`` under ``state`` and their Laplace variances: the diagonal
    of the inverse Hessian of its total negative log likelihood ``n · NLL`` in those raw values (the
    others held). Computed by the owner on its own rows."""
    model = spec.build()
    spec.load(model, state)
    params = [model.get_parameter(spec.param(name).raw_name) for name in names]
    sizes = [p.numel() for p in params]
    with exact_settings(), torch.enable_grad():
        loss = minibatch_nll(model, X, y, prior_weight=0.0) * len(y)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        flat = torch.cat([g.reshape(-1) for g in grads])
        rows = []
        for i in range(len(flat)):
            row = torch.autograd.grad(flat[i], params, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(r if r is not None else torch.zeros_like(p)).reshape(-1)
                                   for r, p in zip(row, params)]))  # fmt: skip
    hessian = torch.stack(rows).detach()
    hessian = (hessian + hessian.T) / 2
    try:
        variance = torch.linalg.inv(hessian).diagonal()
    except torch.linalg.LinAlgError:
        variance = torch.full((len(flat),), math.inf, dtype=hessian.dtype)
    variance = torch.where(variance > 0, variance, torch.full_like(variance, math.inf))  # not a maximum
    values, variances, at = {}, {}, 0
    for name, p, size in zip(names, params, sizes):
        values[name] = p.detach().reshape(-1).clone()
        variances[name] = variance[at : at + size].clone()
        at += size
    return values, variances


def evidence_statistics(
    value: torch.Tensor, variance: torch.Tensor, grid: torch.Tensor = GRID
) -> torch.Tensor:
    """One owner's summable statistics of ``φ̂ ~ N(c, w² + s²)`` at every candidate width ``w`` of
    ``grid``: ``(4, G)`` rows ``1/V``, ``φ̂/V``, ``φ̂²/V``, ``log 2πV``, ``V = w² + s²`` (summed over
    a value's elements). An owner whose variance is infinite (its likelihood is flat there)
    contributes nothing."""
    value, variance = value.reshape(-1, 1).to(torch.float64), variance.reshape(-1, 1).to(torch.float64)
    finite = torch.isfinite(variance)
    V = grid.reshape(1, -1) ** 2 + torch.where(finite, variance, torch.ones_like(variance))
    phi = torch.where(finite, value, torch.zeros_like(value))
    keep = finite.to(torch.float64)
    rows = [keep / V, keep * phi / V, keep * phi**2 / V, keep * torch.log(2 * math.pi * V)]
    return torch.stack([r.sum(0) for r in rows])


def evidence_curve(summed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log evidence ``max_c Σ_k log N(φ̂_k; c, w² + s_k²)`` at each candidate width, and the
    maximising centre ``c``, from the owners' summed :func:`evidence_statistics`."""
    A, B, C, D = summed
    centre = B / A
    return -0.5 * D - 0.5 * (C - B**2 / A), centre


def evidence_width(summed: torch.Tensor, grid: torch.Tensor = GRID) -> float:
    """The candidate width of ``grid`` with the highest log evidence (:func:`evidence_curve`)."""
    if not bool((summed[0] > 0).all()):
        raise InputError("evidence_width: no owner's likelihood is curved in this hyper-parameter")
    curve, _ = evidence_curve(summed)
    return float(grid[int(torch.argmax(curve))])


def evidence_widths(
    spec: GPSpec,
    states: Sequence[HyperState],
    clients: Sequence,
    names: Iterable[str],
    grid: torch.Tensor = GRID,
) -> Shrinkage:
    """The widths the evidence chooses for ``names`` (state names), from each owner's personal fit
    (``states[k]`` on ``clients[k]``'s rows, in the units it trained in): every owner computes its
    :func:`laplace_moments` and :func:`evidence_statistics` on its own rows, and only their sums
    (one summed reply per owner, what secure aggregation releases) choose each name's width."""
    names = sorted(names)
    spec = spec.for_data(list(clients))
    summed = {name: torch.zeros(4, len(grid), dtype=torch.float64) for name in names}
    for state, client in zip(states, clients):
        values, variances = laplace_moments(spec, state, client.X, client.y, names)
        for name in names:
            summed[name] += evidence_statistics(values[name], variances[name], grid)
    return Shrinkage(widths=tuple((name, evidence_width(summed[name], grid)) for name in names))
