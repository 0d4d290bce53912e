"""What secure aggregation (fedgp.flower.SecureAggregation) costs in exactness and time, in process.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/secure_aggregation.py

1. **Exactness** on the README's example (20 owners of 250 points, one per Flower node): the
   transforms' summary (count, Σy, Σ log sd, Σ log² sd; then Σ(y − ȳ)²) through the protocol against
   the same exchange without it — the relative error of each field, and the bound
   ``m · 2^-(fraction_bits+1)`` over the field's magnitude.
2. **Time** of one task with summed fields: DP-FGPR rounds (``ClientDP(noise=1)``, whose clipped
   updates are summed fields, so the protocol runs every round) over ``m`` in-process nodes of one
   small owner each, with and without secure aggregation: seconds per round, median of 3 fits of
   3 rounds (after one warm-up), both measured side by side in one run. In process the messages
   cost nothing, so the difference is the protocol's own computation (keys, Shamir shares,
   encryption, masks); a deployment adds four exchanges per such round.

Writes results/benchmarks/secure_aggregation.csv (one row per measurement).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import gpytorch
import pandas as pd
import torch

import fedgp
from fedgp.engines.tasks import summary_fields
from fedgp.flower import Flower, SecureAggregation
from fedgp.messages import Record, Task
from fedgp.run import ClientDP

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "secure_aggregation.csv"
THETA = {"covar_module.outputscale": 2.0, "likelihood.noise_covar.noise": 0.1,
         "covar_module.base_kernel.lengthscale": [[0.3, 0.5]]}  # fmt: skip


def spec():
    return fedgp.GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))


def summary(federation, secure, stage: str, settings: dict):
    engine = Flower(num_nodes=len(federation), secure=secure).build(spec(), federation)
    engine.start(fedgp.strategies.FGPR(), 0)
    task = Task("summarise", 0, Record({}, {"stage": stage, **settings}), Record())
    fields = summary_fields(2, stage, scales=settings.get("scales", False))
    return engine.run(task, torch.arange(len(federation)), fields).sums


def exactness() -> list[dict]:
    federation = fedgp.synthetic.gp_federation(
        num_clients=20, n=250, d=2, theta=THETA, n_test=50, seed=0
    ).federation
    settings = SecureAggregation()
    rows = []
    first = {"scales": True}
    plain = summary(federation, None, "mean", first)
    secure = summary(federation, settings, "mean", first)
    center = {"center": float(plain["y_sum"] / plain["count"])}
    plain.update(summary(federation, None, "spread", center))
    secure.update(summary(federation, settings, "spread", center))
    for name in plain:
        exact, got = float(plain[name]), float(secure[name])
        rows.append({"measure": "relative_error", "field": name, "nodes": 20, "plain": exact, "secure": got,
                     "value": abs(got - exact) / abs(exact),
                     "bound": settings.error_bound(20) / abs(exact)})  # fmt: skip
    return rows


def seconds_per_round(nodes: int, secure, repeats: int = 3, rounds: int = 3) -> float:
    federation = fedgp.synthetic.gp_federation(num_clients=nodes, n=20, d=2, theta=THETA, seed=1).federation
    private = ClientDP(fedgp.strategies.FGPR(), noise=1.0, delta=0.5 / nodes, reproducible=True)

    def run(r):
        began = time.perf_counter()
        fedgp.fit(spec(), federation, private, rounds=r, seed=0, stop=None, transforms=None,
                  engine=Flower(num_nodes=nodes, secure=secure))  # fmt: skip
        return time.perf_counter() - began

    run(1)  # warm-up
    return statistics.median((run(rounds) - run(1)) / (rounds - 1) for _ in range(repeats))


def main() -> None:
    torch.set_num_threads(1)
    rows = exactness()
    for row in rows:
        print(f"{row['field']:>10}: relative error {row['value']:.2e} (bound {row['bound']:.2e})")
    for nodes in (3, 10, 30):
        plain, secure = seconds_per_round(nodes, None), seconds_per_round(nodes, SecureAggregation())
        print(
            f"{nodes:3d} nodes: {plain * 1e3:7.1f} ms per DP-FGPR round plain, {secure * 1e3:7.1f} ms secure"
        )
        rows += [{"measure": "seconds_per_round", "field": "dp-fgpr", "nodes": nodes, "plain": plain,
                  "secure": secure, "value": secure - plain, "bound": None}]  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(OUT, index=False)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
