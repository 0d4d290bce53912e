"""Werner et al.'s synthetic linear regression, DX(4, 16, 9, 10), as a federated GP.

The authors' setting (their ``run.sh``, option "DX4,16,9,10"; digest §4.1): K = 4 clusters of 16
clients, each with 9 noise-free points x ~ N(k, 1)^10 and y = xᵀθ*_k, θ*_k ∈ 100·{0, 1}^10; every
client starts at its cluster's θ*_k + N(0, 0.1²) (the authors' "oracle" start); η = 0.1, EMA
momentum β = 0.9 (``buf ← 0.1 g + 0.9 buf``, ``buf = g`` at the first step), one gradient step
per epoch, full-batch gradients of f_i(θ) = ‖Xθ − y‖²/(2n).

As a GP: a ``LinearMean`` without bias, the zero kernel and a fixed unit noise, so a client's
per-point NLL is f_i + ½ log 2π and its gradient is exactly the squared-loss gradient. Methods:

* ``fc`` — :class:`~fedgp.strategies.FederatedClustering`: TC with q = 0.25 (×0.99, ≤; the
  authors' synthetic code uses < τ without the 0.99: the same ball unless the 16th and 17th
  distances lie within 1 %), M = 10, from each client's own gradient, everyone in one group;
* ``ground_truth`` — the same with the true clusters as fixed groups and an infinite radius (the
  mean gradient of one's cluster: the authors' ``GroundTruthOptimizer``, whose cluster members share
  one model from the shared start);
* ``local`` — each client alone (singleton groups: the authors' ``DummyPersonalized``).

Metric: mean over clients of ‖θ_i − θ*_{k(i)}‖ after each epoch (the authors' ``_eval_err``).
``updates`` counts the steps taken (0: the start); the authors log epoch E after E + 1 steps, so
their "epoch 100" is our ``updates = 101``. Everything runs in float64; the reference numbers
come from the authors' script run in float32 (their script in float64 gives our ground-truth curve
to all printed digits).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import gpytorch
import pandas as pd
import torch

from fedgp.clustering import FixedRadius, QuantileRadius
from fedgp.experiments.common import Report, default_engine, fit_study, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.experiments.paper import WERNER_SYNTHETIC
from fedgp.models import GPSpec, HyperState, ZeroKernel
from fedgp.strategies import FederatedClustering
from fedgp.synthetic import dx_federation

__all__ = ["REFERENCE", "dx_spec", "synthetic_study", "summary", "reproduce"]

#: The authors' script (float32), seed 0: mean ‖θ_i − θ*‖ at the given epoch
#: (:data:`fedgp.experiments.paper.WERNER_SYNTHETIC`, where every paper's numbers are kept).
REFERENCE = WERNER_SYNTHETIC

W = "mean_module.weights"


def dx_spec(d: int) -> GPSpec:
    """Linear regression as a GP: ``LinearMean(d, bias=False)``, the zero kernel, fixed noise 1."""
    noise = "likelihood.noise_covar.noise"
    start = {noise: 1.0, W: torch.zeros(d, 1)}
    return GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(d, bias=False),
        initial_values=start,
        fixed=[noise],
    )


def synthetic_study(
    seeds: Iterable[int] = (0,),
    epochs: int = 800,
    clusters: int = 4,
    clients_per_cluster: int = 16,
    n: int = 9,
    d: int = 10,
    lr: float = 0.1,
    beta: float = 0.9,
    q: float = 0.25,
    iterations: int = 10,
    engine: str | None = None,
    progress: bool | None = False,
) -> pd.DataFrame:
    """One row per (seed, method, steps taken): the mean distance of the clients' θ_i to their θ*."""
    rows = []
    for seed in seeds:
        data = dx_federation(clusters, clients_per_cluster, n, d, seed=seed)
        spec = dx_spec(d)
        start = data.start[data.labels].unsqueeze(-1)  # each client at its cluster's oracle start
        init = HyperState({**dict(spec.initial_state().expand(len(start))), W: start}, spec.event_shapes)
        truth = data.thetas[data.labels]
        common = dict(lr=lr, momentum=beta, momentum_kind="ema", init=init)
        methods = {
            "fc": FederatedClustering(radius=QuantileRadius(q), iterations=iterations, **common),
            "ground_truth": FederatedClustering(
                groups=tuple(int(z) for z in data.labels),
                radius=FixedRadius(math.inf),
                iterations=1,
                **common,
            ),
            "local": FederatedClustering(groups=tuple(range(len(start))), **common),
        }
        for name, strategy in methods.items():
            errors = [float((start[..., 0] - truth).norm(dim=1).mean())]

            def record(run, errors=errors, truth=truth):
                errors.append(float((run.server.states[W][..., 0] - truth).norm(dim=1).mean()))

            began = time.perf_counter()
            fit_study(spec, data.federation, strategy, epochs, seed, engine, progress, callbacks=[record])
            seconds = time.perf_counter() - began
            rows += [
                {"seed": seed, "method": name, "updates": e, "error": err, "seconds": seconds}
                for e, err in enumerate(errors)
            ]
    return pd.DataFrame(rows)


def summary(curves: pd.DataFrame, epochs=(100, 300, 790, 799)) -> pd.DataFrame:
    """Our error at the authors' epochs E (after E + 1 steps; mean over seeds, and the first seed)
    beside their float32 numbers."""
    at = curves[curves["updates"].isin([e + 1 for e in epochs])].assign(epoch=lambda f: f["updates"] - 1)
    ours = at.groupby(["method", "epoch"], as_index=False).agg(
        error_mean=("error", "mean"), error_max=("error", "max"), seeds=("seed", "nunique")
    )
    first = at[at["seed"] == at["seed"].min()].set_index(["method", "epoch"])["error"].rename("error_seed0")
    out = ours.join(first, on=["method", "epoch"]).merge(REFERENCE, on=["method", "epoch"], how="left")
    out["seed0_over_reference"] = out["error_seed0"] / out["reference_error"]
    return out


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce werner-synthetic``: per-epoch curves and the summary beside the reference."""
    repeats = repeats or (1 if quick else 5)

    def report(curves: pd.DataFrame, minutes: float) -> Report:
        text = (
            "# Werner et al. synthetic linear regression DX(4, 16, 9, 10)\n\n"
            f"{repeats} seeds from {seed}, {minutes:.1f} min, engine {default_engine()}, float64.\n\n"
            + markdown_table(summary(curves))
            + "\n"
        )
        return Report({"werner_synthetic.csv": curves}, {"werner_synthetic.md": text})

    seeds = range(seed, seed + repeats)
    study = partial(synthetic_study, seeds, epochs=110 if quick else 800, progress=progress)
    return reproduction(out_dir, study, report)
