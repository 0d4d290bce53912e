"""What Table 1's reproduction runs: the table itself, the HF-size sweep and the two ablations, each
summarised over repeats (:func:`summarise_runs`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import replace

import gpytorch
import pandas as pd

from fedgp.experiments.table1.jobs import collect_runs, map_jobs, run_job
from fedgp.experiments.table1.methods import fit_fgpr, scores
from fedgp.experiments.table1.protocol import (
    METHODS,
    SUMMARY_COLUMNS,
    SWEEP_METHODS,
    Protocol,
    check_methods,
    repeat_seeds,
)
from fedgp.synthetic.multifidelity import TABLE1_FUNCTIONS, MultiFidelityFunction, multifidelity_federation

__all__ = ["summarise_runs", "table1", "hf_sweep", "SWEEP_BATCH", "p1_ablation", "protocol_ablation"]

#: The sweep holds the optimiser at Table 1's settings: batch 40 (CURRIN) and 50 (PARK).
SWEEP_BATCH = {"currin": 40, "park": 50}


def summarise_runs(runs: pd.DataFrame, by: Sequence[str] = ("function", "method")) -> pd.DataFrame:
    """Per-repeat rows summarised per ``by``: mean ± std (ddof = 1) of RMSE over repeats, mean NLL
    and coverage, number of repeats.

    Failed fits (NaN rows, see :func:`~fedgp.experiments.table1.run_once`) are left out, and
    ``repeats`` counts the others.
    """
    g = runs.groupby(list(by), sort=False)
    out = g.agg(
        rmse_mean=("rmse", "mean"),
        rmse_std=("rmse", lambda s: float(s.std(ddof=1)) if len(s) > 1 else float("nan")),
        nll_mean=("nll", "mean"),
        coverage95_mean=("coverage95", "mean"),
        repeats=("rmse", "count"),
    )
    return out.reset_index()


def table1(
    repeats: int = 30,
    seed: int = 0,
    functions: Iterable[str | MultiFidelityFunction] = TABLE1_FUNCTIONS,
    methods: Sequence[str] = METHODS,
    protocol: Protocol | None = None,
    progress: bool | None = None,
    return_runs: bool = False,
    reuse: pd.DataFrame | None = None,
) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
    """Table 1: one row per (function, method) with RMSE mean ± std, NLL and 95% coverage.

    Repeat ``r`` draws its data and seeds its training with ``seed * 10000 + r``; every method sees
    the same data in a repeat (paired comparison). With ``return_runs`` also returns the per-repeat
    rows. ``reuse``: earlier per-repeat rows (``table1_runs.csv``) kept instead of rerunning them.
    """
    protocol = Protocol() if protocol is None else protocol
    check_methods(methods)
    jobs = [(f, s, tuple(methods), None, None) for f in functions for s in repeat_seeds(seed, repeats)]
    runs = collect_runs(jobs, protocol, progress, "table1", reuse)
    summary = summarise_runs(runs)[SUMMARY_COLUMNS]
    return (summary, runs) if return_runs else summary


def hf_sweep(
    hf_sizes: Sequence[int] = (5, 10, 20, 40, 80),
    repeats: int = 30,
    seed: int = 0,
    functions: Sequence[str] = ("currin", "park"),
    methods: Sequence[str] = SWEEP_METHODS,
    protocol: Protocol | None = None,
    progress: bool | None = None,
    return_runs: bool = False,
    reuse: pd.DataFrame | None = None,
) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
    """RMSE vs HF training size with the paper's LF size (beyond the paper).

    The batch size is held at Table 1's value for each function (``SWEEP_BATCH``; a client with
    fewer points uses all of them), so only the amount of HF data changes along the sweep. Repeat
    seeds are shared across sizes, so the LF design of a repeat is the same at every HF size.
    ``reuse``: earlier per-repeat rows (``table1_sweep_runs.csv``) kept instead of rerunning them.
    """
    protocol = Protocol() if protocol is None else protocol
    check_methods(methods)
    jobs = [
        (f, s, tuple(methods), {"high": int(n)}, SWEEP_BATCH.get(f))
        for f in functions
        for n in hf_sizes
        for s in repeat_seeds(seed, repeats)
    ]
    runs = collect_runs(jobs, protocol, progress, "HF-size sweep", reuse)
    summary = summarise_runs(runs, ("function", "hf_size", "method"))
    summary = summary[["function", "hf_size", *SUMMARY_COLUMNS[1:]]]
    return (summary, runs) if return_runs else summary


def p1_ablation(
    p1_values: Sequence[float] = (1 / 6, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0),
    repeats: int = 30,
    seed: int = 0,
    protocol: Protocol | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """The paper's Fig. 9: FGPR on CURRIN (40 HF / 200 LF) with the HF weight p₁ forced.

    p₁ = 40/240 ≈ 0.17 is plain FGPR; p₁ = 1 ignores the LF client (= Separate). Returns one row
    per p₁ with RMSE mean and std over repeats, NLL and coverage.
    """
    protocol = Protocol() if protocol is None else protocol
    jobs = [(float(p1), s, protocol) for p1 in p1_values for s in repeat_seeds(seed, repeats)]
    runs = pd.DataFrame(map_jobs(_p1_job, jobs, progress, "p1 ablation"))
    return summarise_runs(runs, ("p1",))


def _p1_job(p1: float, seed: int, protocol: Protocol) -> dict:
    problem = multifidelity_federation("currin", n_test=protocol.n_test, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        start = time.perf_counter()
        pred, _ = fit_fgpr(problem, protocol, seed, hf_weight=p1)
    return {"p1": p1, "seed": seed, **scores(problem, "FGPR", pred, time.perf_counter() - start)}


def protocol_ablation(
    repeats: int = 10,
    seed: int = 0,
    functions: Iterable[str] = TABLE1_FUNCTIONS,
    protocol: Protocol | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """FGPR under the two choices where we depart from the authors' code, all four combinations.

    ``minibatch`` ∈ {uniform (ours), nearest (their MF script)} × ``ard`` ∈ {True (ours), False
    (theirs)}; everything else as in ``protocol``. Same seeds as :func:`table1`.
    """
    protocol = Protocol() if protocol is None else protocol
    variants = [(mb, ard) for mb in ("uniform", "nearest") for ard in (True, False)]
    jobs = [
        (f, s, ("FGPR",), None, None, replace(protocol, minibatch=mb, ard=ard))
        for f in functions
        for s in repeat_seeds(seed, repeats)
        for mb, ard in variants
    ]
    frames = map_jobs(run_job, jobs, progress, "protocol ablation")
    runs = pd.concat(frames, ignore_index=True)
    runs["minibatch"] = [job[-1].minibatch for job in jobs]
    runs["ard"] = [job[-1].ard for job in jobs]
    return summarise_runs(runs, ("function", "minibatch", "ard"))
