"""Rounds that survive failing clients: the README example with simulated failures, on both engines.

The README's federation (20 clients of 250 points drawn from a GP with known θ*, 50 test points
each) and FGPR (5 Adam steps of 32 points, lr 0.05, 50 rounds), trained fault-free and with every
participating client failing its local update with probability p = 0.2 per round
(``fit(faults=Faults(simulate=0.2))``: the failure is raised inside the client's update, so the real
failure path runs, and the draw depends only on (seed, round, client), so both engines drop the
same clients). A failed client is dropped from its round and the weights are renormalised over the
replies. Reported per engine and seed: failures, the smallest round, the final mean test RMSE and
its ratio to the fault-free run, and the learned θ beside θ*.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import gpytorch
import pandas as pd

from fedgp.experiments.common import Report, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.models import GPSpec
from fedgp.run import Evaluate, Faults, Progress, fit
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation

__all__ = ["THETA", "run_failure_study", "reproduce"]

#: θ* of the README example.
THETA = {
    "covar_module.outputscale": 2.0,
    "likelihood.noise_covar.noise": 0.1,
    "covar_module.base_kernel.lengthscale": [[0.3, 0.5]],
}


def _one(engine: str, p: float, seed: int, rounds: int) -> dict:
    draws = gp_federation(num_clients=20, n=250, d=2, theta=THETA, n_test=50, seed=0)
    spec = GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))
    strategy = FGPR.authors(local_steps=5, batch_size=32, lr=0.05)
    began = time.perf_counter()
    result = fit(
        spec,
        draws.federation,
        strategy,
        rounds=rounds,
        engine=engine,
        seed=seed,
        transforms=None,
        faults=Faults(simulate=p),
        callbacks=[Evaluate(every=rounds), Progress(False)],
    )
    seconds = time.perf_counter() - began
    h = result.history
    state = result.state.to_dict()
    return {
        "engine": engine,
        "seed": seed,
        "simulate_failures": p,
        "rounds": len(h),
        "failures": int(h["failed"].sum()),
        "rounds_with_failures": int((h["failed"] > 0).sum()),
        "fewest_replies": int(20 - h["failed"].max()),
        "test_rmse_mean": float(h["test_rmse_mean"].iloc[-1]),
        "bytes_down_per_round": float(h["bytes_down"].mean()),
        "bytes_up_per_round": float(h["bytes_up"].mean()),
        **{f"theta.{k}": v for k, v in state.items()},
        "seconds": seconds,
    }


def run_failure_study(
    seeds=range(5), p: float = 0.2, rounds: int = 50, engines=("sequential", "batched")
) -> pd.DataFrame:
    """One row per (engine, seed, p ∈ {0, p}); ``rmse_ratio`` is the RMSE over the fault-free run's."""
    rows = [_one(e, q, s, rounds) for e in engines for s in seeds for q in (0.0, p)]
    frame = pd.DataFrame(rows)
    clean = frame[frame["simulate_failures"] == 0].set_index(["engine", "seed"])["test_rmse_mean"]
    frame["rmse_ratio"] = [r["test_rmse_mean"] / clean[(r["engine"], r["seed"])] for _, r in frame.iterrows()]
    return frame


def reproduce(repeats, out_dir: Path, seed: int = 0, quick: bool = False, progress=None) -> list[Path]:
    """``fedgp reproduce failures``: results/failures.csv and failures.md."""
    repeats = (1 if quick else 5) if repeats is None else repeats
    rounds = 10 if quick else 50

    def report(frame: pd.DataFrame, minutes: float) -> Report:
        summary = (
            frame[frame["simulate_failures"] > 0]
            .groupby("engine")
            .agg(
                runs=("seed", "size"),
                failures_per_run=("failures", "mean"),
                fewest_replies=("fewest_replies", "min"),
                rmse_ratio_max=("rmse_ratio", "max"),
                rmse_ratio_mean=("rmse_ratio", "mean"),
            )
            .reset_index()
        )
        runs = frame[
            [
                "engine",
                "seed",
                "simulate_failures",
                "failures",
                "fewest_replies",
                "test_rmse_mean",
                "rmse_ratio",
            ]
        ]
        text = (
            f"# Simulated client failures (p = 0.2, {rounds} rounds, README example)\n\n"
            + markdown_table(summary, floatfmt=".4f")
            + "\n\nPer run:\n\n"
            + markdown_table(runs, floatfmt=".4f")
            + "\n"
        )
        return Report({"failures.csv": frame}, {"failures.md": text})

    # torch's default threads: the committed failures study was computed so
    study = partial(run_failure_study, range(seed, seed + repeats), rounds=rounds)
    return reproduction(out_dir, study, report, one_thread=False)
