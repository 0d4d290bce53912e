"""``fedgp reproduce table1``: what it runs (full or quick), the rows it keeps from an earlier run
(``--reuse``), and the files it writes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from fedgp.errors import InputError
from fedgp.experiments.common import Report, reproduction
from fedgp.experiments.table1.protocol import (
    METHODS,
    QUICK_PROTOCOL,
    RUN_COLUMNS,
    SWEEP_METHODS,
    Protocol,
    check_methods,
    resolve_function,
)
from fedgp.experiments.table1.report import functions_markdown, markdown
from fedgp.experiments.table1.studies import hf_sweep, p1_ablation, protocol_ablation, table1
from fedgp.synthetic.multifidelity import TABLE1_FUNCTIONS, MultiFidelityFunction

__all__ = ["reproduce"]


def reproduce(
    repeats: int | None,
    out_dir: Path,
    seed: int = 0,
    quick: bool = False,
    progress: bool | None = None,
    function: Sequence[str | MultiFidelityFunction] | None = None,
    reuse: str | os.PathLike | None = None,
    methods: Sequence[str] | None = None,
) -> list[Path]:
    """``fedgp reproduce table1``: Table 1, the HF-size sweep and the p₁ ablation, CSV + markdown.

    ``methods`` (``--methods FGPR AR1 ...``): only these of :data:`METHODS` in Table 1 and the sweep
    (default all); rows of ``reuse`` for the others are not carried over. A selection without any
    of the sweep's methods (:data:`SWEEP_METHODS`) skips the sweep: no ``table1_sweep*.csv``, and
    ``table1.md`` says so.

    ``reuse`` (``--reuse DIR``): keep the per-repeat rows of DIR's ``table1_runs.csv`` and
    ``table1_sweep_runs.csv`` (``table1_<names>_runs.csv`` with ``function``) for the methods they
    hold, and run only what is missing (e.g. a method added since); the p₁ and protocol ablations
    (FGPR only) are kept from DIR's ``table1_p1.csv`` and ``table1_protocol.csv`` when they have the
    same repeats. The rows are taken as they are: reuse only files written with the same protocol.

    ``function`` (``--function forrester mymodule:myfunction``): Table 1's methods on these
    functions only (:func:`resolve_function`; sizes are each function's ``paper_sizes``), written to
    ``table1_<names>.csv``, ``table1_<names>_runs.csv`` and ``table1_<names>.md``; the paper-specific
    sweep and ablations are not run.

    Writes ``table1.csv``, ``table1_sweep.csv``, ``table1_p1.csv``, ``table1_protocol.csv`` (FGPR under
    the authors' minibatch/kernel choices, at most 10 repeats), the per-repeat rows
    (``table1_runs.csv``, ``table1_sweep_runs.csv``) and ``table1.md``. ``quick`` (CI): 2 repeats,
    CURRIN and BRANIN only, 10 rounds, 100 test points, sweep sizes 10 and 40 on CURRIN,
    p₁ ∈ {1/6, 1}: a smoke test of every code path, not a result.
    """
    reused = None if reuse is None else Path(reuse)
    if reused is not None and not reused.is_dir():
        raise InputError(f"reuse: {reused} is not a folder")
    methods = METHODS if methods is None else tuple(methods)
    check_methods(methods)
    plan = _Plan.of(quick, repeats, seed=seed, progress=progress, reuse=reused, methods=methods)
    if function is not None:
        return _reproduce_functions([resolve_function(f) for f in function], plan, out_dir)
    return _reproduce_paper(plan, out_dir)


@dataclass(frozen=True)
class _Plan:
    """What a run covers (the full protocol, or the quick one: every code path, not a result), its
    seed, progress bars, the folder it reuses rows from and the methods it runs."""

    quick: bool
    protocol: Protocol
    repeats: int
    functions: tuple[str, ...]
    sweep: dict = field(default_factory=dict)  # hf_sweep's sizes and functions; {}: its defaults
    p1_values: tuple[float, ...] = (1 / 6, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)
    seed: int = 0
    progress: bool | None = None
    reuse: Path | None = None
    methods: tuple[str, ...] = METHODS

    @classmethod
    def of(cls, quick: bool, repeats: int | None, **run) -> _Plan:
        if not quick:
            return cls(False, Protocol(), 30 if repeats is None else repeats, TABLE1_FUNCTIONS, **run)
        return cls(
            True,
            QUICK_PROTOCOL,
            2 if repeats is None else repeats,
            ("currin", "branin"),
            dict(hf_sizes=(10, 40), functions=("currin",)),
            (1 / 6, 1.0),
            **run,
        )


def _read_runs(folder: Path | None, name: str) -> pd.DataFrame | None:
    """Earlier per-repeat rows to reuse (None without a folder or the file)."""
    if folder is None or not (folder / name).exists():
        return None
    runs = pd.read_csv(folder / name)
    missing = {"function", "hf_size", "seed", "method", "rmse", "nll", "coverage95", "seconds"} - set(runs)
    if missing:
        raise InputError(f"reuse: {folder / name} lacks the columns {sorted(missing)}")
    unknown = sorted(set(runs["method"]) - set(METHODS))
    if unknown:
        raise InputError(f"reuse: {folder / name} has methods {unknown} that table1 does not know")
    return runs.reindex(columns=RUN_COLUMNS)


def _kept_text(*frames: pd.DataFrame | None, methods: Sequence[str] = METHODS) -> str:
    """The selected methods that ``frames`` (earlier per-repeat rows) hold."""
    held = {m for f in frames if f is not None for m in f["method"] if m in methods}
    return ", ".join(sorted(held, key=METHODS.index)) if held else "none"


def _read_summary(folder: Path | None, name: str, repeats: int, key: str, values) -> pd.DataFrame | None:
    """An earlier ablation summary, when it has the same ``repeats`` and ``key`` values."""
    if folder is None or not (folder / name).exists():
        return None
    frame = pd.read_csv(folder / name)
    if key not in frame or "repeats" not in frame or (frame["repeats"] != repeats).any():
        return None
    if sorted(set(frame[key])) != sorted(set(values)):
        return None
    return frame


def _reproduce_functions(functions: list[MultiFidelityFunction], plan: _Plan, out_dir: Path) -> list[Path]:
    if not functions:
        raise InputError("function: name at least one multi-fidelity function")
    stem = "table1_" + "-".join(f.name for f in functions)
    old_runs = _read_runs(plan.reuse, f"{stem}_runs.csv")

    def study():
        return table1(
            plan.repeats,
            plan.seed,
            functions=functions,
            methods=plan.methods,
            protocol=plan.protocol,
            progress=plan.progress,
            return_runs=True,
            reuse=old_runs,
        )

    def report(ran, minutes: float) -> Report:
        summary, runs = ran
        text = functions_markdown(summary, functions, plan.repeats, plan.seed, plan.quick, plan.protocol)
        return Report({f"{stem}.csv": summary, f"{stem}_runs.csv": runs}, {f"{stem}.md": text})

    return reproduction(out_dir, study, report)


def _reproduce_paper(plan: _Plan, out_dir: Path) -> list[Path]:
    reuse, methods = plan.reuse, plan.methods
    old_runs, old_sweep = _read_runs(reuse, "table1_runs.csv"), _read_runs(reuse, "table1_sweep_runs.csv")
    if reuse is not None and old_runs is None and old_sweep is None:
        raise InputError(f"reuse: {reuse} has neither table1_runs.csv nor table1_sweep_runs.csv")
    sweep_methods = [m for m in SWEEP_METHODS if m in methods]

    def study() -> dict[str, pd.DataFrame | None]:
        kw = dict(seed=plan.seed, protocol=plan.protocol, progress=plan.progress)
        summary, runs = table1(
            plan.repeats, functions=plan.functions, methods=methods, return_runs=True, reuse=old_runs, **kw
        )
        sweep = sweep_runs = None  # not run when the selection names none of its methods
        if sweep_methods:
            sweep, sweep_runs = hf_sweep(
                methods=sweep_methods,
                repeats=plan.repeats,
                return_runs=True,
                reuse=old_sweep,
                **plan.sweep,
                **kw,
            )
        ablation = _read_summary(reuse, "table1_p1.csv", plan.repeats, "p1", plan.p1_values)
        if ablation is None:
            ablation = p1_ablation(plan.p1_values, repeats=plan.repeats, **kw)
        repeats = min(plan.repeats, 10)
        choices = _read_summary(reuse, "table1_protocol.csv", repeats, "function", plan.functions)
        if choices is None:
            choices = protocol_ablation(repeats, functions=plan.functions, **kw)
        return {
            "table1.csv": summary,
            "table1_sweep.csv": sweep,
            "table1_p1.csv": ablation,
            "table1_protocol.csv": choices,
            "table1_runs.csv": runs,
            "table1_sweep_runs.csv": sweep_runs,
        }

    def report(frames: dict[str, pd.DataFrame | None], minutes: float) -> Report:
        kept = (
            ""
            if reuse is None
            else f" Rows kept from `{reuse}` (`--reuse`): "
            f"{_kept_text(old_runs, old_sweep if sweep_methods else None, methods=methods)}."
        )
        header = (
            f"# FGPR Table 1 reproduction ({plan.repeats} repeats, seed {plan.seed}"
            f"{', QUICK MODE' if plan.quick else ''})\n\n"
            f"Written by `fedgp reproduce table1` in {minutes:.1f} min.{kept} "
            f"Protocol: {asdict(plan.protocol)}."
        )
        summary, runs, sweep, sweep_runs, ablation, choices = (
            frames[f"table1{end}.csv"] for end in ("", "_runs", "_sweep", "_sweep_runs", "_p1", "_protocol")
        )
        text = markdown(summary, runs, sweep, sweep_runs, ablation, choices, plan.protocol, header)
        return Report(frames, {"table1.md": text})

    return reproduction(out_dir, study, report)
