"""What the message protocol costs: a round's wall time against the clients' own computation.

    .venv/bin/python benchmarks/round_overhead.py                      # K = 100, 1,000, 10,000
    .venv/bin/python benchmarks/round_overhead.py --clients 1000 --rounds 10 --repeats 3

FGPR (M = 32, d = 5, E = 5 Adam steps, RBF-ARD, float64, 64 points per client) on the ``batched``
and ``sequential`` engines, one thread. For each run it times the whole ``fit`` (evaluation off)
and, inside it, the time spent in the clients' side (``fedgp.engines.client.handle``: the strategy's
``local_update`` on the engine's ops). The rest is the round protocol: building records and tasks,
the bytes accounting, checking every reply against its declaration, failure isolation, summing,
aggregation. It also times the same fit with ``loopback=True`` (every message and reply through
safetensors bytes). Medians over repeats; writes results/benchmarks/round_overhead.csv.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

import fedgp
import fedgp.engines.base as base
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "round_overhead.csv"


def timed_fit(draws, engine: str, rounds: int, loopback: bool) -> tuple[float, float]:
    """(wall seconds of the fit, seconds inside the clients' ``handle``)."""
    inside = [0.0]
    original = base.handle

    def counting(*args, **kwargs):
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - began

    base.handle = counting
    try:
        began = time.perf_counter()
        fedgp.fit(
            draws.spec,
            draws.federation,
            FGPR.authors(local_steps=5, batch_size=32),
            rounds=rounds,
            engine=fedgp.engines.ENGINES[engine](loopback=loopback),
            callbacks=[fedgp.run.Evaluate(every=0)],
        )
        return time.perf_counter() - began, inside[0]
    finally:
        base.handle = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    warm = gp_federation(num_clients=8, n=64, d=5, seed=1)
    for engine in ("batched", "sequential"):
        timed_fit(warm, engine, 1, False)  # imports, numba cache, first calls
    for K in args.clients:
        draws = gp_federation(num_clients=K, n=64, d=5, seed=0)
        for engine in ("batched", "sequential"):
            if engine == "sequential" and K > 1000:
                continue
            runs = [timed_fit(draws, engine, args.rounds, False) for _ in range(args.repeats)]
            wired = [timed_fit(draws, engine, args.rounds, True)[0] for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            client = statistics.median(r[1] for r in runs)
            rows.append(
                {
                    "K": K,
                    "engine": engine,
                    "rounds": args.rounds,
                    "wall_s": wall,
                    "client_s": client,
                    "protocol_share": (wall - client) / wall,
                    "loopback_wall_s": statistics.median(wired),
                    "loopback_ratio": statistics.median(wired) / wall,
                }
            )
            print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(OUT, index=False)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
