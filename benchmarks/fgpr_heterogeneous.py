"""FGPR on owners that differ: the default against the authors' settings (issue 33).

    OMP_NUM_THREADS=1 FEDGP_DATA=../shared/datasets .venv/bin/python benchmarks/fgpr_heterogeneous.py

Four federations (:mod:`fedgp.experiments.convergence`: synthetic owners 100x apart in scale with
Pareto sizes and shifted inputs, Grunfeld's 11 firms, fertility in 20 countries, C-MAPSS FD001 by
engine unit), five split seeds each, 100 rounds, ``fit``'s default transforms ("auto"). For each
run: the gap per owner between the central optimum of FGPR's own objective (L-BFGS on the pooled
summed log marginal likelihood, 4 restarts, same transforms) and the learned state, the first
round (in steps of 5) within 1 nat per owner, and the owners' test RMSE, NLL and 95 % coverage
(mean and worst). Then θ recovery on a homogeneous federation with known θ* (50 owners x 100
points, transforms off): each hyper-parameter's relative error beside the pooled MLE's.

Writes results/benchmarks/fgpr_heterogeneous.csv (one row per run),
fgpr_heterogeneous_theta.csv and fgpr_heterogeneous.md (the summary table).

    ... benchmarks/fgpr_heterogeneous.py --causes

instead runs split seed 0 with the variants that separate the candidate causes (the restarted
Adam, minibatches, the averaging space, a decaying rate, several local steps, server momentum, one
federated sd against each owner's own) into results/benchmarks/fgpr_heterogeneous_causes.csv.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch

from fedgp.experiments.common import paper_spec
from fedgp.experiments.convergence import convergence_run, convergence_study, federations, theta_recovery
from fedgp.experiments.metrics import markdown_table
from fedgp.strategies import FGPR, SGD, CosineDecay, FedAvgM
from fedgp.transforms import Standardize, Transforms

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
CONFIGS = {"default: FGPR()": FGPR(), "authors: FGPR.authors()": FGPR.authors()}


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per federation and configuration, over the split seeds: the mean and the worst."""
    grouped = runs.groupby(["federation", "config"], sort=False)
    return pd.DataFrame(
        {
            "gap/owner mean": grouped["gap_per_owner"].mean(),
            "gap/owner worst": grouped["gap_per_owner"].max(),
            "rounds to 1 nat (median)": grouped["rounds_to_1_nat"].median(),
            "coverage mean": grouped["coverage_mean"].mean(),
            "coverage worst owner": grouped["coverage_worst"].min(),
            "coverage mean at the optimum": grouped["coverage_mean_at_optimum"].mean(),
            "test NLL mean": grouped["nll_mean"].mean(),
            "test RMSE mean": grouped["rmse_mean"].mean(),
            "outcome transform": grouped["transforms"].first(),
        }
    ).reset_index()


SGD_CONSTANT = dict(optimizer=SGD(lr=0.2, schedule="constant"), server_optimizer=None)
CAUSES = {
    "authors (Adam restarted, minibatch 32, constrained mean)": FGPR.authors(),
    "authors, full batch": FGPR.authors(batch_size=None),
    "authors, raw mean": FGPR.authors(average_space="raw"),
    "authors, cosine-decayed rate": FGPR.authors(lr_schedule=CosineDecay(100)),
    "SGD 0.2, 5 steps, minibatch 32": FGPR.authors(**SGD_CONSTANT),
    "SGD 0.2, 5 steps, full batch": FGPR.authors(batch_size=None, **SGD_CONSTANT),
    "SGD 0.5, 1 full-batch step, raw mean": FGPR(lr=0.5, batch_size=None, server_optimizer=None),
    "default (1 step, raw mean, FedAdam)": FGPR(),
    "1 step, raw mean, FedAvgM": FGPR(server_optimizer=FedAvgM()),
}
OUTCOMES = {
    "one federated sd": Transforms(outcome=Standardize()),
    "each owner's sd": Transforms(outcome=Standardize(local=True)),
}


def causes(rounds: int = 100) -> pd.DataFrame:
    """Split seed 0: every variant of :data:`CAUSES` under both outcome standardisations."""
    rows = []
    for name, federation in federations(seed=0).items():
        for label, strategy in CAUSES.items():
            for outcome, transforms in OUTCOMES.items():
                row = convergence_run(paper_spec(), federation, strategy, rounds, 0, transforms=transforms)
                rows.append({"federation": name, "config": label, "outcome": outcome, **row})
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main(seeds=range(5), rounds: int = 100) -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    runs = convergence_study(configs=CONFIGS, seeds=tuple(seeds), rounds=rounds)
    runs.to_csv(OUT / "fgpr_heterogeneous.csv", index=False)
    theta = pd.concat(
        [theta_recovery(strategy, rounds=rounds).assign(config=label) for label, strategy in CONFIGS.items()]
    )
    theta.to_csv(OUT / "fgpr_heterogeneous_theta.csv", index=False)
    minutes = (time.perf_counter() - started) / 60
    text = (
        "# FGPR on owners that differ: gap to the central optimum, coverage\n\n"
        f"`{' '.join(sys.argv)}` ({minutes:.0f} min, one thread); {rounds} rounds, split seeds "
        f"{list(seeds)}, fit's default transforms. Gap: (L(θ*) − L(θ)) / K in nats, L the summed "
        "log marginal likelihood of the owners' training data, θ* its central optimum.\n\n"
        + markdown_table(summary(runs), floatfmt=".3g")
        + "\n\n## θ recovery (50 owners x 100 points, known θ*, transforms off)\n\n"
        + markdown_table(theta, floatfmt=".4g")
        + "\n"
    )
    (OUT / "fgpr_heterogeneous.md").write_text(text)
    print(text)


if __name__ == "__main__":
    if "--causes" in sys.argv:
        torch.set_num_threads(1)
        causes().to_csv(OUT / "fgpr_heterogeneous_causes.csv", index=False)
    else:
        main()
