"""Synchronous, synchronous with a deadline, and buffered asynchronous FGPR on owners of unequal speed
(issue 54, study (a)).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/asynchronous.py

The heterogeneous synthetic federation of the convergence benchmark (:func:`fedgp.experiments.
convergence.synthetic`, split seed 0: 12 owners 100x apart in scale, Pareto sizes 8 to 225 points,
shifted inputs), FGPR's defaults, ``fit``'s default transforms. Owners 0-10 have speeds spread
log-uniformly over 10x (1 down to 0.1: a job lasts 1 to 10 units of simulated time); owner 11 (119
points) is a 100x straggler (speed 0.01: 100 units). Configurations:

* ``synchronous``: every step waits for all 12 (``Asynchronous(FGPR(), buffer=12)``, which is FGPR's
  round, bit for bit): 100 units a step.
* ``deadline 10``: synchronous with a timeout of 10 units: the straggler's work is abandoned every
  round (its local update fails, as an engine's timeout fails it; the round renormalises over the
  other 11): 10 units a step.
* ``asynchronous B=b``: the server steps on every ``b`` replies, staleness ``Polynomial(0.5)``,
  fedgp's default weights (``weighting="rate"``: ``p_k`` over the owner's replies per step); and
  ``FedBuff weights`` (``weighting="buffer"``: ``p_k`` renormalised over the buffer), ``Constant()``
  staleness for B=4, FedAdam at a third of its default lr and equal speeds for B=6: to see whether a
  final gap is the steps' noise or the bias of a buffer that fast owners fill.

A second scenario, ``spread10``, has no straggler: the 12 owners' speeds spread log-uniformly over
10x (1 down to 0.1), synchronous (100 steps of 10 units) against asynchronous B=6 with both weights
(400 steps). Its ``sync_gap_then`` column is the synchronous run's gap at the asynchronous run's
final simulated time (the last synchronous step before it): the final gaps compared at equal
simulated time.

Each configuration consumes the same number of replies (100 steps of 12, 200 of 6, 300 of 4, 600 of
2; the deadline's 100 steps of 11): the same client work, spread over different simulated times.

The measure is the objective FGPR trains, over all 12 owners: the gap per owner between the central
optimum of the summed log marginal likelihood (L-BFGS on the pooled data, 4 restarts, same
transforms) and the state after each step (every ``EVERY``-th), against simulated time. Reported per
configuration: steps, simulated time, the time to a gap of 1 and of 0.1 nats per owner, and the
final and best gap. Writes ``results/benchmarks/asynchronous.csv`` (one row per configuration) and
prints it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/asynchronous.py --throughput

instead measures the replay's cost on the batched engine (issue 54, item 4): K = 10⁴ GP owners of 20
points, FGPR with 5 local steps of 16, client jobs per second of wall time for the synchronous round
(3 rounds) against the asynchronous server with B = K/2 (6 steps) and B = K/10 (30 steps), speeds
``LogUniform(10)``; three repetitions in turn after a warm-up, into
``results/benchmarks/asynchronous_throughput.csv``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedgp.experiments.common import paper_spec
from fedgp.experiments.convergence import StateTrace, central_optimum, summed_log_likelihood, synthetic
from fedgp.run import Evaluate, Progress, fit
from fedgp.strategies import FGPR, Asynchronous, Constant, FedAdam, LogUniform, Polynomial
from fedgp.synthetic import gp_federation
from fedgp.testing.engine import Saboteur

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/asynchronous.py"
STRAGGLER = 11
SPEEDS = (*np.geomspace(1.0, 0.1, 11).tolist(), 0.01)
SPREAD10 = tuple(np.geomspace(1.0, 0.1, 12).tolist())
DEADLINE = 10.0
EVERY = 5
TARGETS = (1.0, 0.1)


def configurations(steps: int) -> dict[str, tuple[object, int, float | None]]:
    """``name -> (strategy, steps, time per step or None: the strategy's own sim_time)``."""
    k = len(SPEEDS)
    return {
        "synchronous": (Asynchronous(FGPR(), buffer=k, speeds=SPEEDS), steps, None),
        f"deadline {DEADLINE:g}": (Saboteur(victim=STRAGGLER), steps, DEADLINE),
        "asynchronous B=6": (Asynchronous(FGPR(), buffer=6, speeds=SPEEDS), 2 * steps, None),
        "asynchronous B=6, FedBuff weights": (
            Asynchronous(FGPR(), buffer=6, speeds=SPEEDS, weighting="buffer"),
            2 * steps,
            None,
        ),
        "asynchronous B=4": (Asynchronous(FGPR(), buffer=4, speeds=SPEEDS), 3 * steps, None),
        "asynchronous B=4, FedBuff weights": (
            Asynchronous(FGPR(), buffer=4, speeds=SPEEDS, weighting="buffer"),
            3 * steps,
            None,
        ),
        "asynchronous B=4, constant staleness": (
            Asynchronous(FGPR(), buffer=4, staleness=Constant(), speeds=SPEEDS),
            3 * steps,
            None,
        ),
        "asynchronous B=2": (
            Asynchronous(FGPR(), buffer=2, staleness=Polynomial(0.5), speeds=SPEEDS),
            6 * steps,
            None,
        ),
        "asynchronous B=6, equal speeds": (Asynchronous(FGPR(), buffer=6), 2 * steps, None),
        "asynchronous B=6, equal speeds, FedBuff weights": (
            Asynchronous(FGPR(), buffer=6, weighting="buffer"),
            2 * steps,
            None,
        ),
        "asynchronous B=6, server lr 0.03": (
            Asynchronous(FGPR(server_optimizer=FedAdam(lr=0.03)), buffer=6, speeds=SPEEDS),
            2 * steps,
            None,
        ),
    }


def spread10(steps: int) -> dict[str, tuple[object, int, float | None]]:
    """The second scenario: speeds over 10x, no straggler."""
    return {
        "synchronous": (Asynchronous(FGPR(), buffer=12, speeds=SPREAD10), steps, None),
        "asynchronous B=6": (Asynchronous(FGPR(), buffer=6, speeds=SPREAD10), 4 * steps, None),
        "asynchronous B=6, FedBuff weights": (
            Asynchronous(FGPR(), buffer=6, speeds=SPREAD10, weighting="buffer"),
            4 * steps,
            None,
        ),
    }


def one(strategy, steps: int, per_step: float | None, federation, seed: int = 0) -> dict:
    """Fit, then the gap per owner after every ``EVERY``-th step against simulated time."""
    trace = StateTrace(EVERY)
    started = time.perf_counter()
    result = fit(paper_spec(), federation, strategy, rounds=steps, seed=seed, engine="sequential",
                 callbacks=[trace, Progress(False)])  # fmt: skip
    seconds = time.perf_counter() - started
    clients = result.transform.apply_all(list(federation))[0]
    spec = result.spec
    _, optimum = central_optimum(spec, clients, seed=seed)
    history = result.history
    clock = (
        history["sim_time"].to_numpy()
        if per_step is None
        else per_step * np.arange(1, steps + 1, dtype=float)
    )
    gaps = {
        float(clock[r - 1]): (optimum - summed_log_likelihood(spec, state, clients)) / len(clients)
        for r, state in sorted(trace.states.items())
    }
    row = {
        "steps": steps,
        "sim_time": float(clock[-1]),
        "final_gap_per_owner": gaps[float(clock[-1])],
        "best_gap_per_owner": min(gaps.values()),
    }
    for target in TARGETS:
        reached = [t for t, gap in gaps.items() if gap <= target]
        row[f"time_to_{target:g}_nat"] = reached[0] if reached else math.nan
    if "staleness_mean" in history:
        row["staleness_mean"] = float(history["staleness_mean"].mean())
        row["staleness_max"] = int(history["staleness_max"].max())
    row["straggler_replies"] = (
        int((result.server_state.arrivals()["client"] == STRAGGLER).sum())
        if isinstance(strategy, Asynchronous)
        else 0
    )
    row["wall_seconds"] = round(seconds, 1)
    row["gaps"] = gaps
    return row


def main(steps: int = 100) -> pd.DataFrame:
    torch.set_num_threads(1)
    federation = synthetic(0)
    rows = []
    for scenario, configs in (("straggler", configurations(steps)), ("spread10", spread10(steps))):
        sync_gaps = None
        for name, (strategy, n, per_step) in configs.items():
            row = {"scenario": scenario, "config": name, **one(strategy, n, per_step, federation)}
            gaps = row.pop("gaps")
            sync_gaps = gaps if name == "synchronous" else sync_gaps
            then = [gap for t, gap in sorted(sync_gaps.items()) if t <= row["sim_time"]]
            row["sync_gap_then"] = then[-1] if then else math.nan
            rows.append(row)
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "asynchronous.csv"
    with path.open("w") as handle:
        handle.write(f"# {COMMAND}\n")
        table.to_csv(handle, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table)
    return table


def throughput(k: int = 10_000, rounds: int = 3, repeats: int = 3) -> pd.DataFrame:
    """Client jobs per second on the batched engine: synchronous against asynchronous replays."""
    torch.set_num_threads(1)
    data = gp_federation(num_clients=k, n=20, d=2, seed=0)
    inner = FGPR(local_steps=5, batch_size=16)
    runs = {
        "synchronous": (inner, rounds),
        "asynchronous B=K/2": (Asynchronous(inner, buffer=k // 2, speeds=LogUniform(10.0)), 2 * rounds),
        "asynchronous B=K/10": (Asynchronous(inner, buffer=k // 10, speeds=LogUniform(10.0)), 10 * rounds),
    }
    quiet = [Progress(False), Evaluate(every=0)]
    fit(data.spec, data.federation, inner, rounds=1, engine="batched", callbacks=quiet)  # compile
    rows = []
    for repeat in range(repeats):
        for name, (strategy, steps) in runs.items():
            started = time.perf_counter()
            result = fit(
                data.spec, data.federation, strategy, rounds=steps, engine="batched", callbacks=quiet
            )
            seconds = time.perf_counter() - started
            jobs = int(result.history["participants"].sum())
            rows.append({"config": name, "repeat": repeat, "K": k, "steps": steps, "client_jobs": jobs,
                         "seconds": round(seconds, 3), "jobs_per_second": round(jobs / seconds)})  # fmt: skip
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    median = table.groupby("config", sort=False)["jobs_per_second"].median()
    table["ratio_to_synchronous_median"] = table["config"].map(median / median["synchronous"]).round(3)
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "asynchronous_throughput.csv").open("w") as handle:
        handle.write(f"# {COMMAND} --throughput (2 shared CPU cores, other jobs running)\n")
        table.to_csv(handle, index=False)
    print(table)
    return table


if __name__ == "__main__":
    if "--throughput" in sys.argv:
        throughput()
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
