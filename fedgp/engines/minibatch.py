"""Minibatch indices for local training, identical in every engine.

The indices a client uses in a round depend only on ``(seed, round, client index)`` — see
:mod:`fedgp.rng` — so the sequential and batched engines train on the same minibatches.
"""

from __future__ import annotations

import torch

from fedgp.errors import InputError
from fedgp.rng import client_uniform, nearest_neighbour_minibatches, uniform_minibatches

__all__ = ["draw_minibatches"]


def draw_minibatches(
    seed: int,
    rnd: int,
    indices: torch.Tensor,
    sizes: torch.Tensor,
    steps: int,
    batch_size: int,
    kind: str = "uniform",
    X: torch.Tensor | None = None,
    stream: str = "minibatch",
) -> torch.Tensor:
    """Indices of shape ``(B, steps, batch_size)`` into each client's training data.

    All B clients share ``batch_size`` (engines group clients by their M_k). ``X`` (padded to
    ``(B, N_max, d)``) is needed for ``kind="nearest"``.
    """
    b = len(indices)
    if kind == "uniform":
        u = client_uniform(seed, stream, rnd, indices, (steps, batch_size))
        flat = uniform_minibatches(
            u.reshape(b * steps, batch_size), sizes.repeat_interleave(steps), batch_size
        )
        return flat.reshape(b, steps, batch_size)
    if kind == "nearest":
        if X is None:
            raise InputError("nearest-neighbour minibatches need the clients' inputs")
        u = client_uniform(seed, stream, rnd, indices, (steps,))
        return nearest_neighbour_minibatches(u, X, sizes, batch_size)
    raise InputError(f"unknown minibatch kind {kind!r}")
