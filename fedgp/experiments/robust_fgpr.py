"""Robust FGPR: every attack against every aggregator, in the geometry of Karimireddy et al.

Setting: the README's federation scaled to 25 clients (each 250 training and 50 test points drawn
from one GP with known θ* = outputscale 2, lengthscales 0.3 / 0.5, noise 0.1) and FGPR as in the
README (5 Adam steps of 32 points, lr 0.05, constrained averaging replaced by each aggregator),
50 rounds, 5 seeds. f = 5 of the 25 clients are attacked (f = 11 for IPM, which needs many),
drawn from the seed; every robust rule is told f (TrimmedMean, Krum and Multi-Krum use it).

Attacks: clean, Gaussian, BitFlip, SignFlip, IPM (ε = 0.1), ALIE (Baruch et al.'s z), Mimic,
EdgeOfBall (no labels: halfway to the farthest honest update), LabelFlip. The GP draws have a zero
mean, and a zero-mean GP's likelihood cannot tell y from −y: LabelFlip is no attack here, and the
grid shows it.

Aggregators (raw updates, weights ignored, except the mean): ``mean`` (FedAvg in constrained
units, FGPR's default), ``median``, ``trimmed_mean`` (f), ``geometric_median`` (10 Weiszfeld
steps), ``krum`` (f), ``multi_krum`` (f, m = n − f), ``centred_clipping`` (τ = 0.5, about the
median honest update norm in this setting, 3 iterations), ``threshold_mean`` (TC, q = 0.5, M =
10, from the coordinate median), ``bucketing`` (buckets of 2, then the geometric median).

Metrics: ``theta_error`` = the mean over the trained hyper-parameters of |θ − θ*| / |θ*| (constrained
units), and the honest clients' mean test RMSE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path

import gpytorch
import pandas as pd
import torch

from fedgp import aggregators as A
from fedgp import attacks
from fedgp.experiments.common import Report, default_engine, fit_study, reproduction
from fedgp.experiments.failures import THETA
from fedgp.experiments.metrics import markdown_table
from fedgp.models import GPSpec
from fedgp.run import Faults
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation

__all__ = ["ATTACKS", "AGGREGATORS", "robust_fgpr_study", "grid", "criteria", "seed_criteria", "reproduce"]

#: Attack name -> (builder from the attacker count, attacker count).
ATTACKS: dict[str, tuple[Callable[[int], attacks.Attack] | None, int]] = {
    "clean": (None, 5),
    "gaussian": (lambda f: attacks.Gaussian(count=f), 5),
    "bitflip": (lambda f: attacks.BitFlip(count=f), 5),
    "signflip": (lambda f: attacks.SignFlip(count=f), 5),
    "ipm": (lambda f: attacks.IPM(count=f, epsilon=0.1), 11),
    "alie": (lambda f: attacks.ALIE(count=f), 5),
    "mimic": (lambda f: attacks.Mimic(count=f), 5),
    "edge": (lambda f: attacks.EdgeOfBall(count=f), 5),
    "labelflip": (lambda f: attacks.LabelFlip(count=f), 5),
}

#: Aggregator name -> builder from the number of attackers f the defender assumes.
AGGREGATORS: dict[str, Callable[[int], A.StateAggregator]] = {
    "mean": lambda f: A.WeightedMean(),
    "median": lambda f: A.CoordinateMedian(),
    "trimmed_mean": lambda f: A.TrimmedMean(f=f),
    "geometric_median": lambda f: A.GeometricMedian(),
    "krum": lambda f: A.Krum(f=f),
    "multi_krum": lambda f: A.MultiKrum(f=f),
    "centred_clipping": lambda f: A.CenteredClipping(tau=0.5, iterations=3),
    "threshold_mean": lambda f: A.ThresholdMean(),
    "bucketing": lambda f: A.Bucketing(2, A.GeometricMedian()),
}


def _spec() -> GPSpec:
    return GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))


def robust_fgpr_study(
    seeds: Iterable[int] = range(5),
    rounds: int = 50,
    attack_names: Sequence[str] = tuple(ATTACKS),
    aggregator_names: Sequence[str] = tuple(AGGREGATORS),
    clients: int = 25,
    n: int = 250,
    engine: str | None = None,
    progress: bool | None = False,
) -> pd.DataFrame:
    """One row per (seed, attack, aggregator): θ error and the honest clients' test RMSE / NLL."""
    rows = []
    for seed in seeds:
        draws = gp_federation(num_clients=clients, n=n, d=2, theta=THETA, n_test=50, seed=seed)
        spec = _spec()
        truth = torch.cat([draws.truth[p.name].reshape(-1) for p in spec.params if p.trainable])
        for attack_name in attack_names:
            build, f = ATTACKS[attack_name]
            faults = Faults(attack=None if build is None else build(f))
            for agg_name in aggregator_names:
                rule = AGGREGATORS[agg_name](f)
                strategy = FGPR.authors(local_steps=5, batch_size=32, lr=0.05, aggregator=rule)
                began = time.perf_counter()
                result = fit_study(
                    spec, draws.federation, strategy, rounds, seed, engine, progress, faults=faults
                )
                seconds = time.perf_counter() - began
                learned = torch.cat([result.state[p.name].reshape(-1) for p in spec.params if p.trainable])
                table = result.evaluate()
                table = table[~table["client"].isin(result.attackers)]
                rows.append(
                    {
                        "seed": seed,
                        "attack": attack_name,
                        "aggregator": agg_name,
                        "attackers": len(result.attackers),
                        "theta_error": float(((learned - truth).abs() / truth.abs()).mean()),
                        "rmse": float(table["rmse"].mean()),
                        "nll": float(table["nll"].mean()),
                        "seconds": seconds,
                    }
                )
    return pd.DataFrame(rows)


def grid(table: pd.DataFrame, value: str = "theta_error") -> pd.DataFrame:
    """Aggregator × attack: the mean over seeds of ``value``."""
    out = table.pivot_table(index="aggregator", columns="attack", values=value, aggfunc="mean")
    order_rows = [a for a in AGGREGATORS if a in out.index]
    order_cols = [a for a in ATTACKS if a in out.columns]
    return out.loc[order_rows, order_cols]


def criteria(table: pd.DataFrame, value: str = "theta_error") -> pd.DataFrame:
    """Per attack: the best robust aggregator's error over the clean error of FedAvg (pass ≤ 1.5),
    and the plain mean's ratio (must diverge for Gaussian, exceed 1.2 for BitFlip and IPM)."""
    g = grid(table, value)
    clean = g.loc["mean", "clean"]
    robust = g.drop(index="mean")
    rows = []
    for attack in g.columns:
        if attack == "clean":
            continue
        best = robust[attack].idxmin()
        rows.append(
            {
                "attack": attack,
                "best_robust": best,
                "best_ratio": robust.loc[best, attack] / clean,
                "robust_within_1.5x": bool(robust.loc[best, attack] <= 1.5 * clean),
                "robust_rules_within_1.5x": int((robust[attack] <= 1.5 * clean).sum()),
                "mean_ratio": g.loc["mean", attack] / clean,
            }
        )
    return pd.DataFrame(rows)


#: How the plain mean must fail under each attack for the issue's contrast (ratio to its clean error).
MEAN_FAILS = {"gaussian": 1e3, "bitflip": 1.2, "ipm": 1.2}


def seed_criteria(table: pd.DataFrame, value: str = "theta_error") -> pd.DataFrame:
    """The pass criteria seed by seed: for every attack, whether some robust rule stays within 1.5×
    the plain mean's clean error of that seed; for Gaussian, BitFlip and IPM, whether the plain mean
    diverges (> 10³ × clean; a non-finite error counts) or degrades by more than 20 %."""
    out = {}
    for seed, runs in table.groupby("seed"):
        g = grid(runs, value)
        clean = g.loc["mean", "clean"]
        row = {}
        for attack in g.columns.drop("clean"):
            row[f"{attack}: robust ≤ 1.5 clean"] = bool(g.drop(index="mean")[attack].min() <= 1.5 * clean)
            if attack in MEAN_FAILS:
                row[f"{attack}: mean > {MEAN_FAILS[attack]:g} clean"] = not bool(
                    g.loc["mean", attack] <= MEAN_FAILS[attack] * clean
                )
        out[seed] = row
    return pd.DataFrame.from_dict(out, orient="index").rename_axis("seed")


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce robust-fgpr``: every (seed, attack, aggregator) run, the grids, the criteria."""
    repeats = repeats or (1 if quick else 5)

    def report(table: pd.DataFrame, minutes: float) -> Report:
        per_seed = seed_criteria(table).sum().rename_axis("criterion").rename("seeds").reset_index()
        text = (
            "# Robust FGPR: every attack × every aggregator\n\n"
            f"{repeats} seeds from {seed}, {minutes:.1f} min, engine {default_engine()}.\n\n"
            "## Mean relative θ error\n\n"
            + markdown_table(grid(table).reset_index())
            + "\n\n## Mean honest test RMSE\n\n"
            + markdown_table(grid(table, "rmse").reset_index())
            + "\n\n## Criteria (θ error)\n\n"
            + markdown_table(criteria(table))
            + "\n\n## Criteria (test RMSE)\n\n"
            + markdown_table(criteria(table, "rmse"))
            + "\n\n## Criteria per seed (θ error): seeds passing\n\n"
            + markdown_table(per_seed)
            + "\n"
        )
        return Report({"robust_fgpr.csv": table}, {"robust_fgpr.md": text})

    seeds = range(seed, seed + repeats)
    study = partial(
        robust_fgpr_study, seeds, rounds=10 if quick else 50, n=60 if quick else 250, progress=progress
    )
    return reproduction(out_dir, study, report)
