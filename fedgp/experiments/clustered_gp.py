"""Clustered FGPR and the kernel variants of the clustered model.

1. :func:`clustered_fgpr_study` — a federation mixing GP populations (clients drawn from GP priors
   with different lengthscales/outputscales/noise; ``fedgp reproduce clustered-gp`` runs it with 20
   and with 60 training points per client). Per-client test RMSE and NLL of

   * ``clustered_fgpr`` — the clustered GP with k components, IFCA-style: random restarts, hard
     assignment by local marginal likelihood, FGPR's local Adam steps, size-weighted averaging within
     clusters; each client predicts with its cluster's hyper-parameters conditioned on its own data;
   * ``clustered_fgpr_k1`` — the same with k = 1 (it *is* FGPR: same numbers);
   * ``fgpr`` — single FGPR (Yue & Kontar);
   * ``oracle_fgpr`` — clustered FGPR with the true populations as fixed labels (a reference);
   * ``local_gp`` — each client trains its own hyper-parameters with the same local steps and rounds
     and no averaging (IFCA's "local model": k = K components, client i fixed in component i).

2. :func:`kernel_variants_study` — mixed linear regression with within-cluster variation (each
   client's regressor is its cluster's plus τ N(0, I)). The same two-phase clustered model with a
   noise-only GP per cluster (the paper's model) and with a linear kernel (Bayesian linear
   regression per cluster: ``y ~ N(Φθ_j, v ΦΦᵀ + σ² I)``, whose local conditioning personalises the
   regressor), against a single (k = 1) linear-kernel model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd
import torch

from fedgp.experiments.common import Report, default_engine, fit_study, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.models import GPSpec, ZeroKernel
from fedgp.strategies import FGPR, MomentDescentInit
from fedgp.strategies import clustered as C
from fedgp.strategies.local import Adam, LocalTraining
from fedgp.synthetic import gaussian_mixed_regression, gp_mixture_federation

__all__ = [
    "POPULATIONS",
    "clustered_fgpr_study",
    "kernel_variants_study",
    "per_client_summary",
    "reproduce",
]

#: Three GP populations in 1-D: rough, smooth, and large-amplitude noisy.
POPULATIONS = (
    {
        "covar_module.outputscale": 1.0,
        "covar_module.base_kernel.lengthscale": [[0.05]],
        "likelihood.noise_covar.noise": 0.01,
    },
    {
        "covar_module.outputscale": 1.0,
        "covar_module.base_kernel.lengthscale": [[0.5]],
        "likelihood.noise_covar.noise": 0.01,
    },
    {
        "covar_module.outputscale": 4.0,
        "covar_module.base_kernel.lengthscale": [[0.2]],
        "likelihood.noise_covar.noise": 0.1,
    },
)


def _per_client(result, method: str, labels: torch.Tensor, seed: int) -> pd.DataFrame:
    table = result.evaluate()
    index = {cid: i for i, cid in enumerate(result.federation.ids)}
    table["population"] = [int(labels[index[c]]) for c in table["client"]]
    return table.assign(method=method, seed=seed)


def clustered_fgpr_study(
    seeds: Iterable[int] = range(5),
    populations: Sequence[dict] = POPULATIONS,
    clients_per_population: int = 6,
    n: int = 60,
    n_test: int = 40,
    rounds: int = 60,
    restarts: int = 3,
    local_steps: int = 5,
    batch_size: int | None = 30,
    lr: float = 0.05,
    engine: str | None = None,
    progress: bool | None = False,
) -> pd.DataFrame:
    """Per-client test RMSE/NLL of every method on GP-population mixtures.

    One row per (seed, method, client).
    """
    k = len(populations)
    tables = []
    local = LocalTraining(steps=local_steps, batch_size=batch_size, optimizer=Adam(lr=lr))

    def clustered(components: int, initializer, assigner, restarts: int = 1) -> C.ClusteredGP:
        solver = C.LocalTrainingSolver(local)
        return C.ClusteredGP(components, initializer, assigner, solver, C.ClusterAverage(), restarts)

    for seed in seeds:
        mix = gp_mixture_federation(populations, clients_per_population, n=n, n_test=n_test, seed=seed)
        K = len(mix.federation)
        methods = {
            "clustered_fgpr": clustered(k, C.RandomInit(), C.HardAssigner(), restarts),
            "clustered_fgpr_k1": clustered(1, C.SpecInit(), C.HardAssigner()),
            "fgpr": FGPR.authors(local_steps=local_steps, batch_size=batch_size, lr=lr),
            "oracle_fgpr": clustered(k, C.SpecInit(), C.FixedAssigner(tuple(int(z) for z in mix.labels))),
            # local-only: k = K components, client i alone in component i (no averaging across clients)
            "local_gp": clustered(K, C.SpecInit(), C.FixedAssigner(tuple(range(K)))),
        }
        for name, strategy in methods.items():
            result = fit_study(mix.spec, mix.federation, strategy, rounds, seed, engine, progress)
            tables.append(_per_client(result, name, mix.labels, seed))
    return pd.concat(tables, ignore_index=True)


def per_client_summary(per_client: pd.DataFrame, reference: str = "fgpr") -> pd.DataFrame:
    """Mean per-client RMSE/NLL by method, and how many clients each method beats ``reference`` on NLL."""
    key = ["seed", "client"]
    ref = per_client[per_client["method"] == reference].set_index(key)["nll"]
    rows = []
    for method, sub in per_client.groupby("method", sort=False):
        mine = sub.set_index(key)["nll"]
        better = (mine < ref.reindex(mine.index)).sum() if method != reference else np.nan
        rows.append(
            {
                "method": method,
                "clients": len(sub),
                "mean_rmse": sub["rmse"].mean(),
                "mean_nll": sub["nll"].mean(),
                "median_nll": sub["nll"].median(),
                "mean_coverage95": sub["coverage95"].mean(),
                f"clients_nll_below_{reference}": better,
            }
        )
    return pd.DataFrame(rows)


def _blr_spec(d: int, kernel: str) -> GPSpec:
    # LinearMean draws its initial weights from torch's global generator; start them at zero so a
    # run does not depend on what the process drew before (the k = 1 model starts from the spec).
    mean = gpytorch.means.LinearMean(d, bias=False)
    start = {"likelihood.noise_covar.noise": 0.1, "mean_module.weights": torch.zeros(d, 1)}
    if kernel == "none":
        return GPSpec(kernel=ZeroKernel(), mean=mean, initial_values=start)
    start["covar_module.variance"] = 0.1
    return GPSpec(kernel=gpytorch.kernels.LinearKernel(), mean=mean, initial_values=start)


def kernel_variants_study(
    seeds: Iterable[int] = range(5),
    k: int = 2,
    d: int = 20,
    clients: int = 60,
    n: int = 12,
    n_test: int = 30,
    noise: float = 0.3,
    random_effect: float = 0.1,
    rounds: int = 300,
    lr: float = 0.05,
    engine: str | None = None,
    progress: bool | None = False,
) -> pd.DataFrame:
    """Per-client test RMSE/NLL of the two-phase clustered model with a noise-only and with a linear
    kernel per cluster, and of a single (k = 1) linear-kernel model, on mixed regression with random
    effects (fewer points per client than dimensions, so the cluster prior matters).

    Phase 2 averages gradients within clusters (``GradientStep``): with n_i < d, several local steps
    per round fit each client's own points and bias the averaged noise variance low (client drift).
    """
    tables = []
    for seed in seeds:
        data = gaussian_mixed_regression(
            k=k,
            d=d,
            sizes=[n] * clients,
            noise=noise,
            random_effect=random_effect,
            labels="balanced",
            n_test=n_test,
            seed=seed,
        )
        phase1 = MomentDescentInit(num_anchors=6, anchor_pool="all", theta0_scale=2 / np.sqrt(d))
        variants = (
            ("noise_only", "none", k),
            ("linear_kernel", "linear", k),
            ("linear_kernel_k1", "linear", 1),
        )
        for name, kernel, kk in variants:
            spec = _blr_spec(d, kernel)
            solver, aggregator = C.GradientSolver(), C.GradientStep(lr, "cluster")
            if kk == 1:
                strategy = C.ClusteredGP(1, C.SpecInit(), C.HardAssigner(), solver, aggregator)
            else:
                strategy = C.two_phase(kk, phase1=phase1, solver=solver, aggregator=aggregator)
            total = strategy.init_rounds + rounds  # Phase 1 of the two-phase strategy comes first
            result = fit_study(spec, data.federation, strategy, total, seed, engine, progress)
            tables.append(_per_client(result, name, data.labels, seed))
    return pd.concat(tables, ignore_index=True)


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce clustered-gp``: per-client tables and summaries of both studies."""
    repeats = repeats or (1 if quick else 5)
    seeds = range(seed, seed + repeats)

    def study():
        # few points per client (federation matters) and more (a local GP can learn alone)
        sizes, rounds = ((20,), 15) if quick else ((20, 60), 60)
        gp = pd.concat(
            [
                clustered_fgpr_study(seeds, n=n, rounds=rounds, progress=progress).assign(n_train=n)
                for n in sizes
            ],
            ignore_index=True,
        )
        return gp, kernel_variants_study(seeds, rounds=40 if quick else 300, progress=progress)

    def report(ran, minutes: float) -> Report:
        gp, blr = ran
        text = (
            "# Clustered FGPR and kernel variants\n\n"
            f"{repeats} seeds from {seed}, {minutes:.1f} min, engine {default_engine()}.\n\n"
            "## GP-population mixture (3 populations × 6 clients, n train / 40 test points each)\n\n"
            + "\n\n".join(
                f"n = {n}:\n\n" + markdown_table(per_client_summary(sub, "fgpr"))
                for n, sub in gp.groupby("n_train")
            )
            + "\n\n## Mixed linear regression with random effects (k = 2, d = 20, 60 clients × 12 points)\n\n"
            + markdown_table(per_client_summary(blr, "noise_only"))
            + "\n"
        )
        tables = {"clustered_gp.csv": gp, "clustered_gp_kernels.csv": blr}
        return Report(tables, {"clustered_gp.md": text})

    return reproduction(out_dir, study, report)
