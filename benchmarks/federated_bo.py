"""Federated BO (issue 53): one iteration's time for K = 100 owners, and the regret of four methods.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/federated_bo.py [--seeds 10] [--owners 5] [--iterations 10]

Owners: :func:`fedgp.bo.shared_prior_owners` — each owner's objective a draw from one GP prior on
[0, 1]² (RBF, lengthscale 0.15, outputscale 1, noise variance 1e-3), 10 uniform starting points each.

* ``speed``: K = 100 owners, :class:`~fedgp.bo.FederatedBO` (FGPR's defaults, isotropic RBF, 100
  initial rounds, then 5 warm-started rounds per iteration on the batched engine, qLogEI with 4
  restarts from 128 raw samples): the time of the initial fit, of one iteration's proposals one
  owner at a time and all at once (``batch_proposals=True``, :mod:`fedgp.bo.batched`), from the
  same state, and of the federated update. Rows ``part=speed`` of the CSV.
* ``regret``: ``--owners`` owners, ``--iterations`` iterations, ``--seeds`` seeds; methods
  ``federated`` (as above, 100 initial rounds, 5 per iteration), ``local`` (BoTorch's
  ``SingleTaskGP`` refitted per owner), ``fts`` (M = 100 shared features, 200 own, given the true
  prior's hyper-parameters: an oracle advantage), ``dp-fts-de`` (the same features, the paper's Landmine
  privacy setting q = 0.35, S = 22, z = 1, 2 x 2 cells) and ``random``. Every BO method uses qLogEI or its
  own sampler with 2 restarts from 64 raw samples. Rows ``part=regret``: mean and median over owners
  of the simple regret per (seed, method, iteration), and the seconds per iteration.

Writes results/benchmarks/federated_bo.csv.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import gpytorch
import pandas as pd

import fedgp
from fedgp.bo import (
    DPFTSDE,
    FTS,
    Acquisition,
    BOLoop,
    FederatedBO,
    LocalBO,
    RandomSearch,
    shared_prior_owners,
)
from fedgp.strategies import FGPR

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "federated_bo.csv"
INITIAL = 10


def spec() -> fedgp.GPSpec:
    return fedgp.GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))


def speed(owners: int = 100) -> list[dict]:
    """One iteration's proposals one owner at a time and batched (the same state), and the update."""
    team = shared_prior_owners(owners, seed=0)
    method = FederatedBO(spec(), FGPR(), rounds=5, initial_rounds=100)
    loop = BOLoop(team, method, 1, initial=INITIAL, seed=0)
    began = time.perf_counter()
    loop.start()
    times = {"initial_fit": time.perf_counter() - began}
    began = time.perf_counter()
    method.propose(loop, 1)
    times["proposals_one_by_one"] = time.perf_counter() - began
    method.batch_proposals = True
    row = loop.step()[0]
    times["proposals_batched"], times["update"] = row["seconds_propose"], row["seconds_update"]
    print(f"K={owners}: " + ", ".join(f"{what} {s:.2f} s" for what, s in times.items()))
    return [{"part": "speed", "owners": owners, "what": what, "seconds": s} for what, s in times.items()]


def methods():
    acq = Acquisition("qlogei", num_restarts=2, raw_samples=64)
    return {
        "federated": lambda: FederatedBO(spec(), FGPR(), rounds=5, initial_rounds=100, acquisition=acq),
        "local": lambda: LocalBO(acq),
        "fts": lambda: FTS(0.15, 1.0, 1e-3),
        "dp-fts-de": lambda: DPFTSDE(0.15, 1.0, 1e-3),
        "random": RandomSearch,
    }


def regret(seeds: int, owners: int, iterations: int) -> list[dict]:
    rows = []
    for seed in range(seeds):
        for name, make in methods().items():
            team = shared_prior_owners(owners, seed=100 + seed)
            began = time.perf_counter()
            h = BOLoop(team, make(), iterations, initial=INITIAL, seed=seed).run().history
            seconds = (time.perf_counter() - began) / iterations
            for it, group in h.groupby("iteration"):
                rows.append(
                    {
                        "part": "regret", "owners": owners, "seed": seed, "method": name, "iteration": it,
                        "mean_regret": float(group["regret"].mean()),
                        "median_regret": float(group["regret"].median()), "seconds": seconds,
                    }
                )  # fmt: skip
            print(f"seed {seed} {name}: final mean regret {rows[-1]['mean_regret']:.3f} ({seconds:.1f} s/it)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--owners", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--speed-owners", type=int, default=100)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = speed(args.speed_owners) + regret(args.seeds, args.owners, args.iterations)
    table = pd.DataFrame(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT, index=False)
    final = table[(table["part"] == "regret") & (table["iteration"] == args.iterations)]
    print(final.groupby("method")[["mean_regret", "median_regret", "seconds"]].agg(["mean", "median"]))
    wide = final.pivot(index="seed", columns="method", values="mean_regret")
    for other in ("local", "fts", "dp-fts-de", "random"):
        print(f"federated below {other} on {(wide['federated'] < wide[other]).sum()} of {len(wide)} seeds")


if __name__ == "__main__":
    main()
