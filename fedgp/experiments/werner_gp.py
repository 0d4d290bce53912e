"""The digest's GP experiment (seed_werner.md §7): Federated-Clustering on clustered GP clients,
with and without 20 % Byzantine participants.

Setting: K = 4 clusters × 8 honest clients, 5 training and 100 test points each, x ~ U[−3, 3],
y = φ(x)ᵀw*_k + ε with φ = 8 Gaussian bumps on linspace(−3, 3, 8) of width 0.8 (a standard
deviation), w*_k ~ N(0, 1.5² I), ε ~ N(0, 0.01). Eight bumps and five points: no client can
identify its w alone. Every client's model is an exact GP with mean φ(x)ᵀw (its personal,
clustered block) and a fixed RBF kernel (ℓ = 0.5, s² = 0.05, noise 0.01), trained by gradient
descent on its per-point NLL with η = 0.9 / max_j λ_max(∇²f_j) (the largest curvature over the
honest clients, computed from the simulated data as the digest's prototype does) for 1,500 rounds
from w = 0.

Methods, all the same gradient steps and only the pooling differs (all
:class:`~fedgp.strategies.FederatedClustering`): ``local`` (each client alone), ``fedavg`` (one
group, plain mean: one shared model), ``oracle`` (the true clusters as groups, plain mean), and
``fc_q{q}`` (TC, M = 10, radius 0.99 × the q-quantile, from each client's own gradient), q ∈
{0.1, 0.15, 0.2}; ``fc_q0.2_kernel`` also learns the kernel's outputscale and lengthscale as a
second clustered block (clean only).

Scenarios: ``clean`` (N = 32), and 8 extra Byzantine clients (8/40 = 20 %) sending ``large``
(:class:`~fedgp.attacks.Gaussian`, N(10⁶, 200²)), ``flip`` (:class:`~fedgp.attacks.BitFlip`, the
negated gradient of honest client 0) or ``edge`` (:class:`~fedgp.attacks.EdgeOfBall`, halfway from
the victim's gradient to the nearest gradient of another cluster). Local and the oracle do not
pool with attackers, so they are run clean only. A fixed q covers more points when attackers
raise N (8 of 40 instead of 6.4 of 32): report q with N.

Metrics over the honest clients: mean test RMSE and NLL of each client's posterior (its own w
conditioned on its own data), and mean ‖w_i − w*_k‖. A run whose every client's loss stopped being
finite stops there: it is recorded as diverged, with infinite metrics and the round in
``diverged_round`` (in the committed run, FC with q = 0.1 under bit-flip on seed 0: its small ball
was captured by the 8 identical forged gradients; ``results/README.md``).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path

import gpytorch
import pandas as pd
import torch

from fedgp import attacks
from fedgp.clustering import FixedRadius, QuantileRadius
from fedgp.errors import InputError, RoundFailedError
from fedgp.experiments.common import Report, default_engine, fit_study, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.models import GaussianBumpMean, GPSpec
from fedgp.run import Faults
from fedgp.strategies import FederatedClustering
from fedgp.synthetic import BumpClusters, bump_federation

__all__ = ["SCENARIOS", "bump_spec", "curvature_step", "werner_gp_study", "summary", "criteria", "reproduce"]

#: No attack, then 8 extra clients (20 %) sending Gaussian noise, bit-flipped updates, or edge-of-ball
#: forgeries.
SCENARIOS = ("clean", "large", "flip", "edge")
LS, OS, NOISE, W = (
    "covar_module.base_kernel.lengthscale",
    "covar_module.outputscale",
    "likelihood.noise_covar.noise",
    "mean_module.weights",
)


def bump_spec(data: BumpClusters, train_kernel: bool = False) -> GPSpec:
    """The clients' GP: bump mean (weights from 0), RBF kernel ℓ = 0.5, s² = 0.05, noise 0.01."""
    fixed = [NOISE] if train_kernel else [LS, OS, NOISE]
    return GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        mean=GaussianBumpMean(data.centres, data.width),
        initial_values={LS: 0.5, OS: 0.05, NOISE: 0.01, W: torch.zeros(len(data.centres), 1)},
        fixed=fixed,
    )


def curvature_step(data: BumpClusters, spec: GPSpec, factor: float = 0.9) -> float:
    """``factor / max_j λ_max(Φ_jᵀ K_j⁻¹ Φ_j / n_j)`` over the honest clients: the Hessian of a
    client's per-point NLL in w (constant, as the mean is linear and the kernel fixed)."""
    model = spec.build()
    largest = 0.0
    with torch.no_grad():
        for client, label in zip(data.federation, data.labels.tolist()):
            if label < 0:
                continue
            K = model.covar_module(client.X).to_dense() + model.likelihood.noise * torch.eye(
                client.n, dtype=torch.float64
            )
            phi = model.mean_module.features(client.X)
            H = phi.T @ torch.linalg.solve(K, phi) / client.n
            largest = max(largest, float(torch.linalg.eigvalsh(H).max()))
    return factor / largest


def _methods(data: BumpClusters, lr: float, qs: Sequence[float], scenario: str) -> dict:
    n = len(data.federation)
    fc = {f"fc_q{q:g}": FederatedClustering(lr=lr, radius=QuantileRadius(q)) for q in qs}
    mean = FixedRadius(math.inf)
    methods = {"fedavg": FederatedClustering(lr=lr, radius=mean, iterations=1), **fc}
    if scenario == "clean":
        methods["local"] = FederatedClustering(lr=lr, groups=tuple(range(n)))
        methods["oracle"] = FederatedClustering(
            lr=lr, groups=tuple(int(z) for z in data.labels), radius=mean, iterations=1
        )
    return methods


def _attack(name: str, data: BumpClusters):
    if name == "large":
        return attacks.Gaussian(clients=data.extra)
    if name == "flip":
        return attacks.BitFlip(clients=data.extra)
    if name == "edge":
        return attacks.EdgeOfBall(clients=data.extra, labels=tuple(int(z) for z in data.labels))
    raise InputError(f"unknown scenario {name!r}; known: {SCENARIOS}")


def _row(result, data: BumpClusters) -> dict:
    honest = [c for c, z in zip(data.federation.ids, data.labels.tolist()) if z >= 0]
    table = result.evaluate()
    table = table[table["client"].isin(honest)]
    mine = torch.tensor(honest)
    w = result.state[W][mine, :, 0]
    error = (w - data.weights[data.labels[mine]]).norm(dim=1)
    return {
        "rmse": float(table["rmse"].mean()),
        "nll": float(table["nll"].mean()),
        "weight_error": float(error.mean()),
        "honest": len(honest),
        "participants": len(data.federation),
    }


def _diverged(err: RoundFailedError, data: BumpClusters) -> dict:
    """The row of a run in which every client's loss stopped being finite; other failures raise."""
    found = re.match(r"round (\d+) \(train\): 0 of", str(err))
    if found is None or not all("is not finite" in reason for reason in err.failures.values()):
        raise err
    honest = int((data.labels >= 0).sum())
    return {
        "rmse": math.inf,
        "nll": math.inf,
        "weight_error": math.inf,
        "honest": honest,
        "participants": len(data.federation),
        "diverged_round": int(found.group(1)),
    }


def werner_gp_study(
    seeds: Iterable[int] = range(5),
    rounds: int = 1500,
    qs: Sequence[float] = (0.1, 0.15, 0.2),
    scenarios: Sequence[str] = SCENARIOS,
    kernel_variant: bool = True,
    engine: str | None = None,
    progress: bool | None = False,
) -> pd.DataFrame:
    """One row per (seed, scenario, method): honest clients' mean test RMSE, NLL, weight error."""
    rows = []
    for seed in seeds:
        for scenario in scenarios:
            data = bump_federation(extra=0 if scenario == "clean" else 8, seed=seed)
            spec = bump_spec(data)
            lr = curvature_step(data, spec)
            faults = Faults(attack=None if scenario == "clean" else _attack(scenario, data))
            methods = _methods(data, lr, qs, scenario)
            if kernel_variant and scenario == "clean" and 0.2 in qs:
                methods["fc_q0.2_kernel"] = (
                    FederatedClustering(lr=lr, radius=QuantileRadius(0.2)),
                    bump_spec(data, True),
                )
            for name, strategy in methods.items():
                strategy, method_spec = strategy if isinstance(strategy, tuple) else (strategy, spec)
                began = time.perf_counter()
                row = {"seed": seed, "scenario": scenario, "method": name, "lr": lr, "rounds": rounds}
                try:
                    fed = data.federation
                    result = fit_study(
                        method_spec, fed, strategy, rounds, seed, engine, progress, faults=faults
                    )
                    row.update(_row(result, data), diverged_round=None)
                except RoundFailedError as err:
                    row.update(_diverged(err, data))
                rows.append({**row, "seconds": time.perf_counter() - began})
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean ± sd over seeds of the honest test RMSE (and mean NLL), method × scenario; local and
    the oracle (run clean) stand in every column."""
    stats = table.groupby(["method", "scenario"]).agg(
        rmse=("rmse", "mean"), rmse_sd=("rmse", "std"), nll=("nll", "mean"), seeds=("seed", "nunique")
    )
    return stats.reset_index()


def criteria(table: pd.DataFrame, fc: str = "fc_q0.2") -> pd.DataFrame:
    """The digest's pass criteria per seed for ``fc``: (1) clean RMSE ≤ 0.6 × Local and ≤ 0.4 ×
    FedAvg; (2) under "large" and "flip", RMSE ≤ 1.5 × its clean RMSE while FedAvg's rises by more
    than 20 % (or diverges); (3) RMSE ≤ 2.5 × the oracle's, clean and under every attack."""
    r = table.pivot_table(index="seed", columns=["method", "scenario"], values="rmse")
    out = pd.DataFrame(index=r.index)
    clean = r[(fc, "clean")]
    out["1: fc ≤ 0.6 local"] = clean <= 0.6 * r[("local", "clean")]
    out["1: fc ≤ 0.4 fedavg"] = clean <= 0.4 * r[("fedavg", "clean")]
    for attack in ("large", "flip"):
        if (fc, attack) in r:
            out[f"2: {attack}: fc ≤ 1.5 fc clean"] = r[(fc, attack)] <= 1.5 * clean
            out[f"2: {attack}: fedavg > 1.2 clean"] = ~(r[("fedavg", attack)] <= 1.2 * r[("fedavg", "clean")])
    for scenario in SCENARIOS:
        if (fc, scenario) in r:
            out[f"3: {scenario}: fc ≤ 2.5 oracle"] = r[(fc, scenario)] <= 2.5 * r[("oracle", "clean")]
    return out


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce werner-gp``: the per-run table, the summary and the pass criteria."""
    repeats = repeats or (1 if quick else 5)

    def report(table: pd.DataFrame, minutes: float) -> Report:
        crit = {
            fc: criteria(table, fc)
            for fc in sorted(
                m for m in table["method"].unique() if m.startswith("fc_q") and "kernel" not in m
            )
        }
        passing = "\n\n".join(
            f"### {fc}: seeds passing each criterion (of {len(c)})\n\n"
            + markdown_table(c.sum().rename_axis("criterion").rename("seeds passing").reset_index())
            for fc, c in crit.items()
        )
        text = (
            "# Werner et al. in GP form: Federated-Clustering with Byzantine clients (digest §7)\n\n"
            f"{repeats} seeds from {seed}, {minutes:.1f} min, engine {default_engine()}.\n\n"
            + markdown_table(summary(table))
            + "\n\n"
            + passing
            + "\n"
        )
        return Report({"werner_gp.csv": table}, {"werner_gp.md": text})

    seeds = range(seed, seed + repeats)
    study = partial(werner_gp_study, seeds, rounds=100 if quick else 1500, progress=progress)
    return reproduction(out_dir, study, report)
