"""What a client keeps between tasks: its own tensors, which never leave it.

A strategy with personal hyper-parameters (``FGPR(personal=...)``) trains them on each owner and
keeps them there: they are not in any reply, so the server cannot hold them. The engine that hosts
a client keeps its :class:`ClientMemory` for it (the in-process engines: a dict keyed by the
client's key, emptied when a run starts) and hands the clients of a task theirs as
``ops.memory``. What a task writes is staged and kept only for the clients whose reply arrives as
declared: a client that fails, times out or replies outside its declaration keeps what it had, so
re-running a chunk (an engine halving one to find a failing client) starts from the same values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ClientMemory", "memory_of"]

Store = dict[int, dict[str, torch.Tensor]]


class ClientMemory:
    """The kept tensors of a batch of clients (``keys``, in the order of their ``ClientOps`` rows)."""

    def __init__(self, store: Store, keys: Sequence[int] | torch.Tensor):
        self._store = store
        self._given = keys  # read into Python ints only when a task uses the memory (most never do)
        self._keys: list[int] | None = None
        self._staged: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def keys(self) -> list[int]:
        """The clients' keys, in the order of their ``ClientOps`` rows."""
        if self._keys is None:
            given = self._given
            self._keys = [int(k) for k in (given.tolist() if isinstance(given, torch.Tensor) else given)]
        return self._keys

    @classmethod
    def empty(cls, keys: Sequence[int] | torch.Tensor) -> ClientMemory:
        """The memory of clients that keep nothing (a new client, asked once, outside any engine)."""
        return cls({}, keys)

    def get(self, name: str, default: torch.Tensor) -> torch.Tensor:
        """Each client's kept ``name`` (one row per client), or its row of ``default`` where it
        keeps none yet."""
        rows = []
        for i, key in enumerate(self.keys):
            kept = self._staged.get(key, {}).get(name)
            if kept is None:
                kept = self._store.get(key, {}).get(name)
            rows.append(default[i] if kept is None else kept.to(default.dtype))
        return torch.stack(rows) if rows else default

    def put(self, name: str, rows: torch.Tensor) -> None:
        """Stage ``name`` for each client (``rows``: one per client); :meth:`commit` keeps it."""
        if rows.shape[:1] != (len(self.keys),):
            raise ValueError(f"{len(rows)} rows of {name!r} for {len(self.keys)} clients")
        for key, row in zip(self.keys, rows):
            self._staged.setdefault(key, {})[name] = row.detach().clone()

    @property
    def staged(self) -> bool:
        """Whether the task wrote anything."""
        return bool(self._staged)

    def commit(self, kept: Sequence[bool] | None = None) -> None:
        """Keep what was staged for the clients whose ``kept`` is true (all by default)."""
        if not self._staged:
            return
        for i, key in enumerate(self.keys):
            if key in self._staged and (kept is None or kept[i]):
                self._store.setdefault(key, {}).update(self._staged[key])
        self._staged.clear()


def memory_of(ops) -> ClientMemory:
    """``ops.memory``, or an empty memory where the clients' host keeps none (a new client
    answered outside the engine keeps nothing: it starts from the server's values)."""
    memory = getattr(ops, "memory", None)
    return memory if memory is not None else ClientMemory.empty(ops.indices)
