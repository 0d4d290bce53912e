"""Random numbers that do not depend on who draws them, or in which order.

Every random choice in fedgp is a pure function of ``(seed, stream, round, client)``: the
sequential engine, the batched engine and a Flower node all draw *the same* minibatches for a
client in a round, whatever else they do before, and a run resumed from a checkpoint continues
exactly where it stopped (the round number is all the RNG "state" there is).

numpy's ``SeedSequence`` gives this for a handful of generators (``generator`` below, used for
server-side choices such as client sampling). Per-client draws in the inner loop use a
counter-based hash instead, because building one numpy ``Generator`` per client per round costs
more than the GP step itself when ten thousand clients are simulated. The hash is SplitMix64
(Steele, Lea & Flood 2014), vectorised over clients with numpy's wrapping ``uint64`` arithmetic;
no maintained library exposes a vectorised counter-based generator keyed by arbitrary integers.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch

from fedgp.errors import InputError

try:  # optional: compiles the one scalar loop below
    import numba as _numba
except ImportError:  # pragma: no cover - exercised only where numba is absent
    _numba = None

__all__ = [
    "generator",
    "client_uniform",
    "stream_id",
    "uniform_minibatches",
    "nearest_neighbour_minibatches",
    "draw_minibatches",
    "client_keys",
    "GOLDEN",
    "MIX1",
    "MIX2",
]

#: SplitMix64's increment (also read by compiled code that draws the same numbers).
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: SplitMix64's first mixing multiplier.
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
#: SplitMix64's second mixing multiplier.
MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN, _M1, _M2 = GOLDEN, MIX1, MIX2


def stream_id(name: str) -> int:
    """A stable integer for a named random stream (``"minibatch"``, ``"sample"``, ...)."""
    return zlib.crc32(name.encode())


def generator(seed: int, stream: str, *path: int) -> np.random.Generator:
    """A numpy generator for one server-side decision, e.g. ``generator(seed, "sample", round)``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), stream_id(stream), *map(int, path)]))


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _key(parts: Sequence[int | np.ndarray]) -> np.ndarray:
    key = np.zeros((), dtype=np.uint64)
    for part in parts:
        part = np.asarray(part).astype(np.int64).astype(np.uint64)
        key = _mix(key + _GOLDEN + _mix(part + _GOLDEN))
    return key


def client_keys(seed: int, stream: str, round: int, clients) -> np.ndarray:
    """``(len(clients),)`` uint64 keys: the i-th number of client c's stream is
    ``_mix(key[c] + i · GOLDEN)``, i = 1, 2, ... (what :func:`client_uniform` draws from)."""
    clients = np.asarray(clients.cpu() if isinstance(clients, torch.Tensor) else clients)
    with np.errstate(over="ignore"):
        return _key([seed, stream_id(stream), round, clients.reshape(-1)])


def client_uniform(
    seed: int, stream: str, round: int, clients: Sequence[int] | np.ndarray | torch.Tensor, shape
) -> torch.Tensor:
    """Uniform [0, 1) float64 numbers, shape ``(len(clients), *shape)``.

    Row ``i`` depends only on ``(seed, stream, round, clients[i])``: asking for one client or for
    ten thousand at once gives that client the same numbers.
    """
    shape = tuple(np.atleast_1d(shape).tolist()) if not isinstance(shape, tuple) else shape
    clients = np.asarray(clients.cpu() if isinstance(clients, torch.Tensor) else clients)
    base = client_keys(seed, stream, round, clients).reshape(-1, 1)  # (B, 1)
    with np.errstate(over="ignore"):
        count = int(np.prod(shape, dtype=np.int64))
        counters = np.arange(1, count + 1, dtype=np.uint64).reshape(1, -1)
        bits = _mix(base + counters * _GOLDEN)
    u = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return torch.from_numpy(u.reshape(len(clients), *shape))


def uniform_minibatches(u: torch.Tensor, sizes: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Minibatches drawn uniformly without replacement (Floyd's algorithm).

    ``u``: uniforms of shape ``(R, batch_size)``; ``sizes``: the local data size of each row's
    client, shape ``(R,)``, each ``>= batch_size``. Returns indices of shape ``(R, batch_size)``.
    Floyd's algorithm needs ``batch_size`` numbers per subset and no permutation of the whole
    local data, so memory stays ``O(R * batch_size)`` however large the clients are.
    """
    rows, m = u.shape
    if m != batch_size:
        raise InputError(f"expected {batch_size} uniforms per row, got {m}")
    if bool((sizes < batch_size).any()):
        raise InputError("every client must hold at least batch_size points")
    # Floyd: at step j draw t in [0, top_j], top_j = N - m + j; if t is taken, take top_j instead.
    # Every draw is computed up front; only the "taken" test has to run step by step.
    top = sizes.to(torch.float64).unsqueeze(1) - m + torch.arange(m, dtype=torch.float64)
    draws = torch.minimum(torch.floor(u * (top + 1)), top).to(torch.long)
    top = top.to(torch.long)
    chosen = draws.clone()
    if _numba is not None:
        _resolve_taken(chosen.numpy(), top.numpy())
        return chosen
    for j in range(1, m):
        taken = (chosen[:, :j] == draws[:, j : j + 1]).any(dim=1)
        chosen[:, j] = torch.where(taken, top[:, j], draws[:, j])
    return chosen


def _resolve_taken_loop(chosen: np.ndarray, top: np.ndarray) -> None:
    """Floyd's "if taken, take top" in place, row by row (compiled when numba is installed: the
    tensor loop above costs 30 small operations per minibatch draw)."""
    rows, m = chosen.shape
    for r in range(rows):
        for j in range(1, m):
            for i in range(j):
                if chosen[r, i] == chosen[r, j]:
                    chosen[r, j] = top[r, j]
                    break


_resolve_taken = None if _numba is None else _numba.njit(cache=True)(_resolve_taken_loop)


def nearest_neighbour_minibatches(
    u: torch.Tensor, X: torch.Tensor, sizes: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """Minibatches of a random centre point and its ``batch_size - 1`` nearest neighbours.

    This is the correlated-data sampler of Chen et al. (2020) used by the FGPR authors for the
    multi-fidelity runs. ``u``: shape ``(B, S)`` uniforms (one per step); ``X``: the clients' inputs,
    shape ``(B, N_max, d)``, padded beyond each client's size; returns ``(B, S, batch_size)``.
    Ties in distance go to the lower index (stable sort), so padding never changes the result.
    """
    b, steps = u.shape
    arange = torch.arange(X.shape[1])
    centres = torch.minimum(torch.floor(u * sizes.unsqueeze(1)).long(), (sizes - 1).unsqueeze(1))
    centre_x = torch.gather(X, 1, centres.unsqueeze(-1).expand(b, steps, X.shape[-1]))  # (B, S, d)
    dist = ((X.unsqueeze(1) - centre_x.unsqueeze(2)) ** 2).sum(-1)  # (B, S, N_max)
    dist = dist.masked_fill(arange.view(1, 1, -1) >= sizes.view(-1, 1, 1), float("inf"))
    order = torch.sort(dist, dim=-1, stable=True).indices
    return order[..., :batch_size]


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
    """Indices of shape ``(B, steps, batch_size)`` into each client's training data: what every
    engine's local training draws, a function of ``(seed, round, client index)`` only, so the
    sequential and batched engines train on the same minibatches.

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
