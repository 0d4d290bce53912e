"""The Ray engine against the in-process batched engine, in one run.

    .venv/bin/python benchmarks/ray_engine.py                     # K = 10,000, R = 10, 2 workers
    .venv/bin/python benchmarks/ray_engine.py --clients 2000 --rounds 5

FGPR (M = 32, d = 5, E = 5 Adam steps, RBF-ARD, float64, 64 points per client), evaluation off.
Measures, side by side: the in-process ``batched`` engine with 1 thread; ``ray`` with 2 local
workers of 1 thread each (after an untimed round, so actor start-up and data loading are excluded
and reported separately); Ray's fixed cost per round (a round of a one-point task on every
worker: messages, scheduling, serialisation); the compute of one 512-client chunk; one shard's
work run alone in-process (``one_shard_alone_s``), so that ``ray_s / one_shard_alone_s`` separates
what the workers lose by running side by side on shared cores from Ray's own cost. Writes
results/benchmarks/ray_engine.csv and prints the scale-out estimate the README quotes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

import fedgp
from fedgp.engines.ray import RayEngine, shutdown
from fedgp.engines.tasks import HELLO_FIELDS
from fedgp.messages import Task
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "ray_engine.csv"


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    K, R, E = args.clients, args.rounds, 5
    draws = gp_federation(num_clients=K, n=64, d=5, seed=0)
    strategy = FGPR.authors(local_steps=E, batch_size=32)

    def fit(engine):
        return fedgp.fit(
            draws.spec,
            draws.federation,
            strategy,
            engine=engine,
            rounds=R,
            callbacks=[fedgp.run.Evaluate(every=0)],
        )

    fedgp.fit(
        draws.spec,
        draws.federation,
        strategy,
        engine="batched",
        rounds=1,
        callbacks=[fedgp.run.Evaluate(every=0)],
    )
    batched = timed(lambda: fit("batched"), args.repeats)
    # What one worker computes, alone on the machine: the batched engine on one shard's clients.
    shard = draws.federation[: -(-K // args.workers)]
    one_shard = timed(
        lambda: fedgp.fit(
            draws.spec, shard, strategy, engine="batched", rounds=R, callbacks=[fedgp.run.Evaluate(every=0)]
        ),
        args.repeats,
    )

    began = time.perf_counter()
    ray_engine = RayEngine(draws.spec, draws.federation, num_workers=args.workers)
    startup = time.perf_counter() - began
    fit(ray_engine)  # untimed: first calls on the actors
    ray = timed(lambda: fit(ray_engine), args.repeats)

    # Ray's fixed cost per round: one task per worker that does (almost) nothing.
    probe = torch.tensor([int(s[0]) for s in ray_engine.shards])
    per_round = timed(lambda: ray_engine.run(Task("hello"), probe, dict(HELLO_FIELDS)), 20)
    ray_engine.close()
    shutdown()

    chunk = gp_federation(num_clients=512, n=64, d=5, seed=2)
    fedgp.fit(
        chunk.spec,
        chunk.federation,
        strategy,
        engine="batched",
        rounds=1,
        callbacks=[fedgp.run.Evaluate(every=0)],
    )
    chunk_round = timed(
        lambda: fedgp.fit(
            chunk.spec,
            chunk.federation,
            strategy,
            engine="batched",
            rounds=1,
            callbacks=[fedgp.run.Evaluate(every=0)],
        ),
        args.repeats,
    )
    steps = K * R * E
    row = {
        "K": K,
        "rounds": R,
        "workers": args.workers,
        "batched_s": batched,
        "ray_s": ray,
        "speedup": batched / ray,
        "batched_client_steps_per_s": steps / batched,
        "ray_client_steps_per_s": steps / ray,
        "ray_startup_s": startup,
        "ray_fixed_cost_per_round_s": per_round,
        "chunk512_round_s": chunk_round,
        "overhead_share": max(0.0, 1 - (batched / args.workers) / ray),
        "one_shard_alone_s": one_shard,
        "parallel_slowdown": ray / one_shard,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([row]).to_csv(OUT, index=False)
    print(pd.Series(row).to_string())
    # Scale-out estimate: a round costs max over workers of (its chunks' compute) + the fixed cost.
    for machines, cores in ((8, 2), (8, 16)):
        workers = machines * cores
        big = 1_000_000
        chunks_per_worker = -(-big // 512) / workers
        est = chunks_per_worker * chunk_round + per_round
        print(
            f"estimate: K = 10^6 on {machines} machines x {cores} cores ({workers} workers): "
            f"{est:.1f} s per round ({chunks_per_worker:.0f} chunks of 512 per worker)"
        )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
