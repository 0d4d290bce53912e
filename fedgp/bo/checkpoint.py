"""``BOCheckpoint``: a BO loop that stops (a crash, a budget, a machine given back) resumes where it was.

::

    loop = BOLoop(owners, FederatedBO(spec), iterations=30, callbacks=[BOCheckpoint("bo-run")])
    loop.run()   # interrupted after iteration 12 ...
    # ... later, the same owners (their objectives are code: give them again) and the same settings:
    BOLoop(owners_again, FederatedBO(spec), iterations=30, callbacks=[BOCheckpoint("bo-run")]).run()

The folder holds ``loop.fedgp`` — every owner's evaluations, the iteration reached and the history —
and what the method needs to go on (:meth:`fedgp.bo.method.Method.checkpoint`: ``FederatedBO``
writes its last federated fit, ``federated.fedgp``, whose server state the next rounds warm-start
from; FTS and DP-FTS-DE re-derive theirs from the seed and the owners' rows; local BO and random
search keep none). A resumed loop proposes, evaluates and learns exactly as the unbroken one would
have (tested). The files are fedgp's sealed container (:mod:`fedgp.messages.container`): reading
one runs no code, a damaged one is refused, and with ``key`` only its holder can write one the loop
accepts. An owner's objective is never written: it is the owner's code, given again on resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedgp.bo.callbacks import BOCallback
from fedgp.bo.owner import DTYPE
from fedgp.errors import FileFormatError, InputError
from fedgp.files import write_atomically
from fedgp.messages.container import check_key, pack, seal, unpack, unseal

__all__ = ["BOCheckpoint", "LOOP_FILE"]

#: The loop's part of a BO checkpoint folder.
LOOP_FILE = "loop.fedgp"
_FORMAT, _VERSION = "fedgp.bo.loop", 1


@dataclass
class BOCheckpoint(BOCallback):
    """Write the loop's state into the folder ``path`` after every ``every``-th iteration (and the
    last); a loop started with a ``BOCheckpoint`` whose folder holds one resumes from it, after
    checking that its owners (ids, input width) and method are the ones written. ``key``: seal the
    files with an HMAC (:func:`fedgp.messages.container.seal`)."""

    path: str | Path
    every: int = 1
    key: bytes | str | None = None

    def __post_init__(self) -> None:
        self._written: int | None = None  # the iteration last written
        self.path = Path(self.path)
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise InputError(f"BOCheckpoint(every=...) must be an int >= 1, got {self.every!r}")
        check_key(self.key)

    # -- writing ------------------------------------------------------------------------------------
    def on_iteration(self, loop, rows) -> None:
        if loop.iteration % self.every == 0:
            self.write(loop)

    def on_end(self, loop) -> None:
        """The last state, whatever ``every`` skipped (written once: not again by ``on_iteration``)."""
        if self._written != loop.iteration:
            self.write(loop)

    def write(self, loop) -> Path:
        """The loop's state now, into ``path`` (the method's part first: the loop file is the mark of
        a complete checkpoint). Returns the loop file's path."""
        self.path.mkdir(parents=True, exist_ok=True)
        loop.method.checkpoint(self.path, self.key)
        tensors = {}
        for k, owner in enumerate(loop.owners):
            tensors[f"owner/{k}/X"], tensors[f"owner/{k}/y"] = owner.X, owner.y
        header = {
            "iteration": loop.iteration,
            "method": loop.method.name,
            "owners": [repr(o.id) for o in loop.owners],
            "dim": loop.owners[0].dim,
            "seed": loop.seed,
            "history": _history_columns(loop.history, tensors, [o.id for o in loop.owners]),
        }
        target = self.path / LOOP_FILE
        write_atomically(target, seal(pack(_FORMAT, _VERSION, header, tensors), self.key))
        self._written = loop.iteration
        return target

    # -- reading ------------------------------------------------------------------------------------
    def restore(self, loop) -> bool:
        """Put the written state back into ``loop`` (its owners' rows, iteration and history, and
        the method's state); ``False`` when the folder holds no checkpoint yet."""
        target = self.path / LOOP_FILE
        if not target.is_file():
            return False
        source = str(target)
        header, tensors = unpack(unseal(target.read_bytes(), source, self.key), _FORMAT, _VERSION, source)
        expected = {
            "owners": [repr(o.id) for o in loop.owners],
            "dim": loop.owners[0].dim,
            "method": loop.method.name,
            "seed": loop.seed,
        }
        for name, value in expected.items():
            if header.get(name) != value:
                raise InputError(
                    f"{source}: written for {name} {header.get(name)!r}, this loop has {value!r}: resume "
                    "with the same owners, method and seed, or give another folder"
                )
        iteration = header.get("iteration")
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise FileFormatError(f"{source}: iteration must be an int >= 0, got {iteration!r}")
        for k, owner in enumerate(loop.owners):
            X, y = tensors.get(f"owner/{k}/X"), tensors.get(f"owner/{k}/y")
            if X is None or y is None or X.dtype != DTYPE or y.dtype != DTYPE:
                raise FileFormatError(
                    f"{source}: owner {owner.id!r}'s evaluations are missing or not float64"
                )
            if X.dim() != 2 or X.shape[1] != owner.dim or y.shape != (len(X),) or len(X) <= iteration:
                raise FileFormatError(
                    f"{source}: owner {owner.id!r}'s evaluations have shapes {tuple(X.shape)}, "
                    f"{tuple(y.shape)}: not {owner.dim} inputs with one value each, one per iteration"
                )
            owner.X, owner.y = X.clone(), y.clone()
        loop.history = _history_rows(header.get("history"), tensors, [o.id for o in loop.owners], source)
        loop.iteration = iteration
        loop.method.resume(loop, iteration, self.path, self.key)
        return True


def _history_columns(
    history: list[dict[str, Any]], tensors: dict[str, torch.Tensor], ids: list[Any]
) -> dict[str, Any]:
    """The history as columns: numbers into ``tensors`` (float64, NaN kept), owners by position, the
    rest as text in the header."""
    names = list(dict.fromkeys(k for row in history for k in row))
    text: dict[str, Any] = {}
    for name in names:
        values = [row.get(name) for row in history]
        if name == "owner":
            tensors["history/owner"] = torch.tensor(
                [float(ids.index(v)) for v in values], dtype=torch.float64
            )
            text[name] = "owner"
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            tensors[f"history/{name}"] = torch.tensor([float(v) for v in values], dtype=torch.float64)
            if all(isinstance(v, int) for v in values):
                text[name] = "int"
        else:
            text[name] = [None if v is None else str(v) for v in values]
    return {"names": names, "rows": len(history), "text": text}


def _history_rows(
    columns: Any, tensors: dict[str, torch.Tensor], ids: list[Any], source: str
) -> list[dict[str, Any]]:
    """The history rows written by :func:`_history_columns`."""
    if not isinstance(columns, dict) or not isinstance(columns.get("rows"), int):
        raise FileFormatError(f"{source}: no history")
    rows, text, out = columns["rows"], columns.get("text", {}), {}
    for name in columns.get("names", []):
        kind = text.get(name)
        if isinstance(kind, list):
            values = kind
        else:
            column = tensors.get(f"history/{name}")
            if column is None or column.shape != (rows,):
                raise FileFormatError(f"{source}: history column {name!r} is missing or of the wrong length")
            values = column.tolist()
            if kind == "owner":
                if not all(v in range(len(ids)) for v in values):
                    raise FileFormatError(f"{source}: history names an owner that is not this loop's")
                values = [ids[int(v)] for v in values]
            elif kind == "int":
                values = [int(v) if math.isfinite(v) else v for v in values]
        if len(values) != rows:
            raise FileFormatError(f"{source}: history column {name!r} is of the wrong length")
        out[name] = values
    return [{name: out[name][i] for name in out} for i in range(rows)]
