"""Multi-output on the batched engine: one T-output ICM fit against T independent single-output fits.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/multi_output_batched.py                 # K = 1,000, T = 7
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/multi_output_batched.py --clients 100 --repeats 2

Each of K owners holds ``--points`` inputs (d = 5, as benchmarks/engine_throughput.py: 100 points) and
all T outputs at each (mixtures of two latent functions plus noise); ``--missing p`` drops each entry
with probability p. Settings as the single-output throughput benchmarks: FGPR.authors with E = 5
local Adam steps on minibatches of M = 32 rows, float64, evaluation off, the default transforms;
``--local-epochs N`` takes N passes over each owner's rows instead, so an owner's joint fit (T·points
rows) takes T times the steps of each of its single-output fits.

- ``joint``: ``MultiOutputSpec(outputs=T)`` (ICM, rank 1, RBF-ARD) on the owners' long-form rows
  (T·points rows each), ``engine="batched"``: the Hadamard tensor path
  (:mod:`fedgp.engines.hadamard_gp`);
- ``independent``: T fits of ``GPSpec()`` (ScaleKernel RBF-ARD), one per output on that output's rows,
  ``engine="batched"`` (the fused compiled round where numba is installed); their times add up;
- ``one_tensor``: one of those single-output fits on the tensor path (``Batched(compiled=False)``),
  the path the joint fit runs on: joint / one_tensor is what the task covariance itself costs.

Rounds per second: rounds 2..R of each fit (a callback stamps each round's end), so set-up (transforms,
the engine's self-check) and the first round are left out; the whole fit's wall time is reported too.
The configurations alternate within each repeat, in one process; the table reports medians and their
ratios (the machine may be loaded: compare ratios, not absolute times). Writes
results/benchmarks/multi_output_batched.csv (one row per configuration, with the command).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.data.outputs import outputs_client
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.strategies import FGPR

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "multi_output_batched.csv"
D, E, M = 5, 5, 32


def owners(K: int, n: int, T: int, missing: float, seed: int = 0) -> tuple[list, list]:
    """``(X (n, d), Y (n, T) with NaN where missing)`` per owner: mixtures of two latent functions."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(T, 2, generator=g, dtype=torch.float64)
    w = torch.randn(2, D, generator=g, dtype=torch.float64)
    Xs, Ys = [], []
    for _ in range(K):
        X = torch.rand(n, D, generator=g, dtype=torch.float64)
        latent = torch.stack([torch.sin(3 * X @ w[0]), torch.cos(2 * X @ w[1])], 1)
        Y = latent @ mix.T + 0.1 * torch.randn(n, T, generator=g, dtype=torch.float64)
        drop = torch.rand(n, T, generator=g, dtype=torch.float64) < missing
        drop[:2] = False  # every owner keeps two rows of every output
        Xs.append(X)
        Ys.append(Y.masked_fill(drop, float("nan")))
    return Xs, Ys


class RoundClock(fedgp.run.Callback):
    """The wall-clock time at the end of each round."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_round(self, run, row) -> None:
        self.stamps.append(time.perf_counter())


def timed_fit(spec, fed, rounds: int, engine, epochs: int | None = None) -> tuple[float, float]:
    """``(seconds for rounds 2..R, seconds for the whole fit)``; E = 5 local steps, or ``epochs``
    passes over each owner's rows (then an owner of T·n rows takes T times the steps)."""
    clock = RoundClock()
    began = time.perf_counter()
    local = dict(local_steps=E) if epochs is None else dict(local_steps=None, local_epochs=epochs)
    fedgp.fit(
        spec,
        fed,
        FGPR.authors(batch_size=M, **local),
        rounds=rounds,
        engine=engine,
        seed=0,
        callbacks=[clock, fedgp.run.Evaluate(every=0)],
    )
    return clock.stamps[-1] - clock.stamps[0], time.perf_counter() - began


def federations(K: int, n: int, T: int, missing: float) -> tuple[Federation, list[Federation]]:
    """The joint (long-form) federation and one single-output federation per output."""
    Xs, Ys = owners(K, n, T, missing)
    joint = Federation([outputs_client(X, Y, id=k) for k, (X, Y) in enumerate(zip(Xs, Ys))])
    single = [
        Federation(
            [
                ClientData(X[~Y[:, t].isnan()], Y[~Y[:, t].isnan(), t], id=k)
                for k, (X, Y) in enumerate(zip(Xs, Ys))
            ]
        )
        for t in range(T)
    ]
    return joint, single


def measure(args) -> pd.DataFrame:
    joint, single = federations(args.clients, args.points, args.outputs, args.missing)
    spec = MultiOutputSpec(outputs=args.outputs)
    warm_joint, warm_single = federations(16, 40, args.outputs, args.missing)
    timed_fit(spec, warm_joint, 2, "batched")  # imports, numba's cache, first calls: untimed
    timed_fit(fedgp.GPSpec(), warm_single[0], 2, "batched")
    timed_fit(fedgp.GPSpec(), warm_single[0], 2, fedgp.engines.Batched(compiled=False))
    epochs = args.local_epochs
    times: dict[str, list[tuple[float, float]]] = {"joint": [], "independent": [], "one_tensor": []}
    for _ in range(args.repeats):
        times["joint"].append(timed_fit(spec, joint, args.rounds, "batched", epochs))
        fits = [timed_fit(fedgp.GPSpec(), fed, args.rounds, "batched", epochs) for fed in single]
        times["independent"].append((sum(f[0] for f in fits), sum(f[1] for f in fits)))
        tensor = fedgp.engines.Batched(compiled=False)
        times["one_tensor"].append(timed_fit(fedgp.GPSpec(), single[0], args.rounds, tensor, epochs))
    rows = []
    for name, runs in times.items():
        rounds_s = statistics.median(r[0] for r in runs)
        rows.append(
            {
                "config": name,
                "K": args.clients,
                "T": args.outputs,
                "points": args.points,
                "missing": args.missing,
                "rounds": args.rounds,
                "local": f"{args.local_epochs} epochs" if args.local_epochs else f"{E} steps",
                "repeats": args.repeats,
                "rounds_per_s": (args.rounds - 1) / rounds_s,
                "fit_wall_s": statistics.median(r[1] for r in runs),
            }
        )
    table = pd.DataFrame(rows).set_index("config")
    table["joint_time_ratio"] = table.loc["joint", "rounds_per_s"] ** -1 * table["rounds_per_s"]
    table["joint_fit_ratio"] = table.loc["joint", "fit_wall_s"] / table["fit_wall_s"]
    table["load_average"] = os.getloadavg()[0]
    threads = os.environ.get("OMP_NUM_THREADS")
    prefix = [f"OMP_NUM_THREADS={threads}"] if threads else []
    table["command"] = " ".join(
        [*prefix, ".venv/bin/python benchmarks/multi_output_batched.py", *sys.argv[1:]]
    )
    return table.reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--outputs", type=int, default=7)
    parser.add_argument("--points", type=int, default=100, help="inputs per owner (each with T outputs)")
    parser.add_argument("--missing", type=float, default=0.0, help="probability an entry is missing")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--local-epochs", type=int, default=None, help="local epochs instead of E = 5 steps (M = 32)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = measure(args)
    print(f"load average at the end: {os.getloadavg()}")
    print(table.drop(columns="command").to_string(index=False))
    print(
        "joint_time_ratio: the joint fit's time per round over this configuration's (independent: all T "
        "fits together); joint_fit_ratio: the same for the whole fit"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, mode="a", header=not args.out.exists(), index=False)


if __name__ == "__main__":
    main()
