"""What the reproductions share: the engine, a quiet fit, a cache to resume from, and the skeleton of
``fedgp reproduce NAME`` (:func:`reproduction`: the output folder, the timed study, the files)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import pandas as pd
import torch

from fedgp.errors import InputError
from fedgp.files import write_atomically
from fedgp.models import GPSpec
from fedgp.run import Evaluate, FitResult, Progress, fit

__all__ = [
    "paper_spec",
    "default_engine",
    "fit_study",
    "Report",
    "reproduction",
    "write_report",
    "TaskCache",
    "cache_folder",
]

T = TypeVar("T")


def paper_spec() -> GPSpec:
    """The FGPR paper's prior, written out: ``ScaleKernel(RBFKernel())`` (one lengthscale) and a zero
    mean, the model the reproductions and studies made before fedgp's default kernel became one
    lengthscale per feature (:mod:`fedgp.defaults`); their committed tables stay the ones these
    give."""
    import gpytorch

    return GPSpec(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), gpytorch.means.ZeroMean())


def default_engine() -> str:
    """The engine of the studies: ``"batched"``, the sequential reference's numbers, faster."""
    return "batched"


def fit_study(
    spec: GPSpec,
    federation,
    strategy,
    rounds: int,
    seed: int,
    engine=None,
    progress: bool | None = False,
    *,
    transforms=None,
    callbacks=(),
    **options,
) -> FitResult:
    """:func:`fedgp.fit` as the studies call it: the default engine, no per-round test metrics, no
    data transforms unless asked (each paper's protocol scales its data itself), and ``progress``
    for the rounds; ``options`` are ``fit``'s others (``faults``, ``stop``)."""
    return fit(
        spec,
        federation,
        strategy,
        rounds=rounds,
        seed=seed,
        engine=engine or default_engine(),
        transforms=transforms,
        callbacks=[Evaluate(every=0), Progress(progress), *callbacks],
        **options,
    )


@dataclass(frozen=True)
class Report:
    """What one reproduction writes into its folder, in this order: the CSV ``tables`` (without the
    index; ``None``: not written by this run), then the ``texts`` (markdown), each under its file name."""

    tables: Mapping[str, pd.DataFrame | None]
    texts: Mapping[str, str] = field(default_factory=dict)


def write_report(out: Path, report: Report) -> list[Path]:
    """Write ``report``'s files into ``out``; the paths written, in order."""
    written = []
    for name, frame in report.tables.items():
        if frame is not None:
            frame.to_csv(out / name, index=False)
            written.append(out / name)
    for name, text in report.texts.items():
        (out / name).write_text(text)
        written.append(out / name)
    return written


def reproduction(
    out_dir: str | os.PathLike,
    study: Callable[[], T],
    report: Callable[[T, float], Report],
    *,
    one_thread: bool = True,
) -> list[Path]:
    """The skeleton of every ``fedgp reproduce NAME``; each experiment supplies what differs.

    Creates ``out_dir`` (first, so a wrong folder fails before hours of work), runs ``study()``,
    then writes ``report(results, minutes)`` (:class:`Report`; ``minutes``: the study's wall time)
    and returns the paths written. ``one_thread``: torch on one thread while the study runs, the
    caller's setting restored after: these runs are many small problems, and threads contending on
    a shared machine made them several times slower. ``False`` leaves torch's threads as they are
    (the studies whose committed numbers were computed with torch's default threads).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if one_thread:
        torch.set_num_threads(1)
    try:
        started = time.perf_counter()
        results = study()
        return write_report(out, report(results, (time.perf_counter() - started) / 60))
    finally:
        torch.set_num_threads(threads)


def cache_folder(name: str, quick: bool) -> Path | None:
    """``$FEDGP_CACHE/<name>``, where a long run keeps its finished tasks; None when ``FEDGP_CACHE``
    is not set or in quick mode (a smoke test is not worth keeping, and must not resume a real run)."""
    root = os.environ.get("FEDGP_CACHE")
    return None if quick or not root else Path(root) / name


#: Settings fields whose ``None`` reproduces the runs made without them (``partition_seed=None``:
#: partitions drawn from the master seed). Left unset they stay out of the stamp, so a cache whose
#: stamp predates such a field describes the same run and still resumes.
_OPTIONAL_SETTINGS = {"partition_seed"}


class TaskCache:
    """Finished tasks of a long run, kept as CSV files so that an interrupted run resumes.

    A task is kept under a stem as one CSV per part, named by ``parts`` (default ``<stem>.csv`` and
    ``<stem>_details.csv``); it counts as cached only when every part is there. Each file is written
    atomically (:func:`fedgp.files.write_atomically`): a run killed while saving leaves the task to
    redo, never half a file that a later run would read as finished. Cells written empty are read
    back as missing, and only those (a string such as ``"NA"`` stays a string).

    With ``settings``, the folder remembers the settings and seed that wrote it (``settings.txt``;
    the engine does not count) and refuses to serve another run; without, each stem must name what
    its task depends on (Table 1 names its jobs by a hash of their settings). ``cache_dir=None``:
    nothing is kept.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike | None,
        settings=None,
        seed: int = 0,
        parts: Sequence[str] = ("", "_details"),
    ) -> None:
        self.folder = None if cache_dir is None else Path(cache_dir)
        self.parts = tuple(parts)
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        if settings is None:
            return
        stamp = self.folder / "settings.txt"
        fields = asdict(replace(settings, engine=None))
        fields = {k: v for k, v in fields.items() if not (k in _OPTIONAL_SETTINGS and v is None)}
        text = repr(sorted(fields.items())) + f" seed={seed}"
        if stamp.exists() and stamp.read_text() != text:
            raise InputError(
                f"{self.folder} holds results of different settings or seed; use another cache_dir"
            )
        write_atomically(stamp, text.encode())

    def _files(self, stem: str) -> list[Path]:
        return [self.folder / f"{stem}{part}.csv" for part in self.parts]

    def load(self, stem: str) -> tuple[pd.DataFrame, ...] | None:
        """The task's frames (one per part), or None when it is not cached."""
        if self.folder is None or not all(f.exists() for f in self._files(stem)):
            return None
        return tuple(pd.read_csv(f, keep_default_na=False, na_values=[""]) for f in self._files(stem))

    def save(self, stem: str, frames: Sequence[pd.DataFrame]) -> None:
        """Write a task's frames (one per part) under ``stem``; nothing when the cache has no folder."""
        if self.folder is None:
            return
        if len(frames) != len(self.parts):
            raise InputError(f"TaskCache.save: {len(self.parts)} parts, got {len(frames)} frames")
        for frame, f in zip(frames, self._files(stem)):
            write_atomically(f, frame.to_csv(index=False).encode())
