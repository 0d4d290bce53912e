"""Checkpoints: everything needed to continue a run and end at a bit-identical result.

A checkpoint holds the completed round count, the server state, the history so far, and the RNG
"state" — which in fedgp is only the master seed, because every random draw is a function of
``(seed, stream, round, client)`` (see :mod:`fedgp.rng`). It also records the strategy and spec
it belongs to, so resuming a run with different settings is refused instead of silently mixing.
Files are written atomically (temporary file, then rename) with ``torch.save``; they are pickles,
so load only checkpoints you wrote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint"]

FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    completed_rounds: int
    server_state: Any
    history: list[dict[str, Any]]
    seed: int
    strategy: str
    spec: tuple[str, ...]
    engine: str
    rng: str = "fedgp.rng counter-based: all draws derive from (seed, stream, round, client)"
    version: int = FORMAT_VERSION


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(checkpoint.__dict__, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    data = torch.load(path, weights_only=False)
    if data.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {data.get('version')}, expected {FORMAT_VERSION}")
    return Checkpoint(**data)
