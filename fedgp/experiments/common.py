"""What the reproductions share: the engine, a quiet fit, the output folder, a cache to resume from."""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import torch

import fedgp
from fedgp.models import GPSpec

__all__ = ["default_engine", "fit_study", "prepare_output", "TaskCache"]


def default_engine() -> str:
    """``"batched"`` when that engine is registered (same results, faster), else ``"sequential"``."""
    from fedgp.fit import ENGINES

    return "batched" if "batched" in ENGINES else "sequential"


def fit_study(
    spec: GPSpec,
    federation,
    strategy,
    rounds: int,
    seed: int,
    engine: str | None = None,
    progress: bool | None = False,
    **kwargs,
):
    """:func:`fedgp.fit` as the studies call it: the default engine, no per-round test metrics, and
    no data transforms unless asked (each paper's protocol scales its data itself)."""
    kwargs.setdefault("outcome_transform", None)
    kwargs.setdefault("input_transform", None)
    return fedgp.fit(
        spec,
        federation,
        strategy,
        rounds=rounds,
        seed=seed,
        engine=engine or default_engine(),
        progress=progress,
        eval_every=0,
        **kwargs,
    )


def prepare_output(out_dir: str | os.PathLike) -> Path:
    """The output folder, created; torch on one thread (these runs are many small problems, and
    threads contending on a shared machine made them several times slower)."""
    torch.set_num_threads(1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


#: Settings fields that later versions added with a default of ``None`` (the earlier behaviour).
_ADDED_LATER = {"partition_seed"}


class TaskCache:
    """Finished tasks of a long run, kept as CSV pairs so that an interrupted run resumes.

    The folder remembers the settings and seed that wrote it (``settings.txt``; the engine does not
    count) and refuses to serve another run. ``cache_dir=None``: nothing is kept.
    """

    def __init__(self, cache_dir: str | os.PathLike | None, settings, seed: int) -> None:
        self.folder = None if cache_dir is None else Path(cache_dir)
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = self.folder / "settings.txt"
        fields = asdict(replace(settings, engine=None))
        # Settings added after runs were cached count only when set, so those caches still resume.
        fields = {k: v for k, v in fields.items() if not (k in _ADDED_LATER and v is None)}
        text = repr(sorted(fields.items())) + f" seed={seed}"
        if stamp.exists() and stamp.read_text() != text:
            raise ValueError(
                f"{self.folder} holds results of different settings or seed; use another cache_dir"
            )
        stamp.write_text(text)

    def _files(self, stem: str) -> tuple[Path, Path]:
        return self.folder / f"{stem}.csv", self.folder / f"{stem}_details.csv"

    def load(self, stem: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """The task's (rows, details), or None when it is not cached."""
        if self.folder is None or not all(f.exists() for f in self._files(stem)):
            return None
        return tuple(pd.read_csv(f) for f in self._files(stem))

    def save(self, stem: str, frames: tuple[pd.DataFrame, pd.DataFrame]) -> None:
        """Write a task's frames under ``stem`` (nothing when the cache has no folder)."""
        if self.folder is not None:
            for frame, f in zip(frames, self._files(stem)):
                frame.to_csv(f, index=False)
