"""What a client sends at the ``summarise`` exchange (:mod:`fedgp.transforms` says why), computed
from its raw data where it is hosted: its count and sums, its own mean and sd, and its input box
widened outward to a coarse grid (integer-valued ends moved further, by a hash of its own data,
with ``hide_discrete``), so that no data value leaves.

Clients of equal size are reduced together, as rows of one stacked tensor, with the bits each
would get alone: a reply does not depend on which clients share a chunk."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from fedgp.data.client import ClientData

__all__ = ["client_summaries", "outward_bounds", "own_outcome_maps", "power_of_two", "hidden_steps"]


def own_outcome_maps(targets: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's own mean and sd (ddof = 1) of its targets, as ``Standardize(local=True)`` uses
    them: ``(K,)`` offsets and scales (mean 0 without targets, sd 1 where it cannot be estimated).

    The sd is written as √(Σ(y − ȳ)² / (n − 1)) rather than ``torch.std`` so that clients of equal
    size, reduced as rows of one stacked tensor, get the bits each would alone (a row's sum and mean
    are the 1-D ones; ``torch.std``'s row and 1-D algorithms differ in the last bits), and in a
    power-of-two unit near the client's largest deviation (:func:`power_of_two`): scaling by a power
    of two is exact, so the bits are those of the plain formula wherever that neither underflows nor
    overflows, and targets of 1e-200 (whose squares underflow to 0) get their sd too."""
    offsets = torch.zeros(len(targets), dtype=torch.float64)
    scales = torch.ones(len(targets), dtype=torch.float64)
    groups: dict[int, list[int]] = {}
    for position, y in enumerate(targets):
        groups.setdefault(len(y), []).append(position)
    for n, positions in groups.items():
        if n == 0:
            continue
        Y = torch.stack([targets[i] for i in positions]).to(torch.float64)
        mean = Y.mean(1)
        offsets[positions] = mean
        if n > 1:
            deviations = Y - mean[:, None]
            unit = power_of_two(deviations.abs().amax(1))
            sd = (((deviations / unit[:, None]) ** 2).sum(1) / (n - 1)).sqrt() * unit
            scales[positions] = torch.where(sd > 0, sd, torch.ones_like(sd))
    return offsets, scales


def power_of_two(magnitude: torch.Tensor) -> torch.Tensor:
    """The power of two at or below each (positive, finite) ``magnitude``; 1 for 0. Dividing by it
    before squaring keeps a sum of squares in float64's range and changes no bit otherwise."""
    _, exponent = torch.frexp(magnitude)
    power = torch.ldexp(torch.ones_like(magnitude), exponent - 1)
    return torch.where((magnitude > 0) & torch.isfinite(magnitude), power, torch.ones_like(magnitude))


# -- the summarise exchange ---------------------------------------------------------------------------


def client_summaries(
    clients: Sequence[ClientData],
    stage: str,
    bounds: bool = False,
    center: Any = 0.0,
    scales: bool = False,
    hide_discrete: bool = False,
    unit: float = 1.0,
    outputs: int = 0,
) -> dict[str, torch.Tensor]:
    """A batch of clients' reply to the ``summarise`` task (one row per client, tensors), from their
    raw data (:func:`fedgp.engines.tasks.summary_fields` declares it).

    Clients of equal size are reduced together, as rows of one stacked tensor: a row's sum, minimum
    and maximum have the bits of the client's own, so a reply does not depend on which clients
    share a chunk (one per Flower node, thousands in the batched engine).

    ``outputs`` T > 0 (a multi-output spec's rows, the output index in X's last column): the count, Σy
    and Σ((y − ȳ_t)/unit)² are per output, ``(k, T)``, about the outputs' means ``center`` (T,)."""
    if outputs:
        return _per_output(clients, stage, outputs, center, unit) | (
            _bounds(clients, hide_discrete) if bounds and stage != "spread" else {}
        )
    if stage == "spread":
        return {"y_sumsq": _per_size(clients, "y", lambda Y: (((Y - center) / unit) ** 2).sum(1))}
    out = {
        "count": torch.tensor([float(c.n) for c in clients], dtype=torch.float64),
        "y_sum": _per_size(clients, "y", lambda Y: Y.sum(1)),
    }
    if bounds:
        out.update(_bounds(clients, hide_discrete))
    if scales:  # a client's own sd as the local Standardize computes it (1 where it cannot)
        log_sd = own_outcome_maps([c.y for c in clients])[1].log()
        out.update(log_sd=log_sd.to(torch.float64), log_sd_sq=(log_sd * log_sd).to(torch.float64))
    return out


def _bounds(clients: Sequence[ClientData], hide_discrete: bool) -> dict[str, torch.Tensor]:
    """Each client's input box, widened outward (``x_min``, ``x_max``: ``(k, d)``)."""
    if hide_discrete:
        boxes = [_client_box(c, hide_discrete) for c in clients]
        lower = torch.stack([b[0] for b in boxes]).to(torch.float64)
        return {"x_min": lower, "x_max": torch.stack([b[1] for b in boxes]).to(torch.float64)}
    lower = _per_size(clients, "X", lambda X: X.amin(1), clients[0].n_features)
    upper = _per_size(clients, "X", lambda X: X.amax(1), clients[0].n_features)
    low, high = outward_bounds(lower, upper)
    return {"x_min": low, "x_max": high}


def _per_output(
    clients: Sequence[ClientData], stage: str, outputs: int, center: Any, unit: float
) -> dict[str, torch.Tensor]:
    """Per-output count and Σy (stage ``"mean"``) or Σ((y − center_t)/unit)² (``"spread"``), ``(k, T)``:
    each client's rows summed by the output index in X's last column (in row order, whatever the chunk)."""
    center = torch.as_tensor(center, dtype=torch.float64).expand(outputs)
    names = ("y_sumsq",) if stage == "spread" else ("count", "y_sum")
    out = {name: torch.zeros(len(clients), outputs, dtype=torch.float64) for name in names}
    for i, client in enumerate(clients):
        task, y = client.X[:, -1].long(), client.y.to(torch.float64)
        if stage == "spread":
            out["y_sumsq"][i].index_add_(0, task, ((y - center[task]) / unit) ** 2)
        else:
            out["count"][i].index_add_(0, task, torch.ones_like(y))
            out["y_sum"][i].index_add_(0, task, y)
    return out


def _per_size(clients: Sequence[ClientData], field: str, reduce, *event: int) -> torch.Tensor:
    """``reduce`` over the stacked ``field`` (``(k, n, d)`` inputs or ``(k, n)`` targets) of each
    group of clients with ``n`` training points; the rows back in the clients' order."""
    groups: dict[int, list[int]] = {}
    for position, client in enumerate(clients):
        groups.setdefault(client.n, []).append(position)
    out = torch.empty(len(clients), *event, dtype=torch.float64)
    for positions in groups.values():
        stacked = torch.stack([getattr(clients[i], field) for i in positions])
        out[positions] = reduce(stacked).to(torch.float64)
    return out


def _client_box(client: ClientData, hide_discrete: bool) -> tuple[torch.Tensor, torch.Tensor]:
    lower, upper = client.X.min(0).values, client.X.max(0).values
    low, high = outward_bounds(lower, upper)
    if not hide_discrete:
        return low, high
    # A further step must pass an integer: a grid step under 1 (an integer feature spanning under 8)
    # moved 0-3 times stays between the same two integers, and the one just inside is the extreme.
    step = torch.clamp(_grid_step(lower, upper), min=1.0)
    discrete = (client.X == torch.round(client.X)).all(0)
    down, up = hidden_steps(client.X)
    return low - discrete * down * step, high + discrete * up * step


def hidden_steps(X: torch.Tensor, most: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Per feature, how many further grid steps (0 to ``most``) a client moves the lower and the
    upper end of its box: from a BLAKE2 hash of its own inputs, so the same data give the same box
    on every engine and run, and a server that does not hold the data cannot predict it."""
    digest = hashlib.blake2b(X.detach().cpu().numpy().tobytes(), digest_size=2 * X.shape[1]).digest()
    draws = torch.tensor(list(digest), dtype=torch.float64).reshape(2, X.shape[1]) % (most + 1)
    return draws[0], draws[1]


def _grid_step(lower: torch.Tensor, upper: torch.Tensor, steps: int = 16) -> torch.Tensor:
    width = upper - lower
    reference = torch.where(width > 0, width, torch.maximum(lower.abs(), upper.abs()))
    reference = torch.where(reference > 0, reference, torch.ones_like(reference))
    step = torch.exp2(torch.ceil(torch.log2(reference / steps)))
    # Below the smallest normal number the grid would underflow to 0 (a subnormal value gave NaN).
    return torch.clamp(step, min=torch.finfo(step.dtype).tiny)


def outward_bounds(
    lower: torch.Tensor, upper: torch.Tensor, steps: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's per-feature box, widened to a coarse grid so that no data value leaves.

    A minimum or maximum *is* a data value (for one feature, a whole row of X). Each end is moved
    outward to a multiple of a power of two near 1/``steps`` of the box's width (of the value
    itself for a zero-width feature), strictly beyond the data: the server learns the box to about
    1/16 of its width, never a value a client holds.
    """
    step = _grid_step(lower, upper, steps)
    low = torch.floor(lower / step) * step
    high = torch.ceil(upper / step) * step
    low = torch.where(low >= lower, low - step, low)
    high = torch.where(high <= upper, high + step, high)
    return low, high
