"""Bayesian optimisation on a new client with a federated prior: ``fedgp reproduce botorch-loop``.

Does a GP prior learned federatedly from other owners' data help a newcomer optimise its own
function with few evaluations? Setting (one run per seed):

- **Function family**: draws from one GP prior on [0, 1]², zero mean, RBF kernel with
  lengthscale 0.15 and outputscale 1, observed with noise variance 1e-3. Each function is a
  random-Fourier-feature draw (Rahimi & Recht; 1,000 features), so an optimiser can query it
  anywhere (an exact GP draw exists only on a fixed grid).
- **Federation**: 20 clients, each holding 40 noisy evaluations of its own draw at uniform points.
  FGPR (5 Adam steps of 20 points, lr 0.05, 60 rounds, batched engine, data transforms off: the
  functions are already on the unit square with unit scale) learns the shared hyper-parameters;
  no client data leave a client.
- **New client**: a fresh draw, 3 uniform starting points, then 10 iterations of BoTorch
  ``qLogExpectedImprovement`` (q = 1, ``optimize_acqf`` with 4 restarts from 128 raw samples, best
  observed value as ``best_f``), each evaluation noisy.
- **Methods**: ``federated`` — ``result.to_botorch(new client)``, the federated hyper-parameters
  fixed, conditioned on the points so far; ``local`` — BoTorch's default ``SingleTaskGP`` on the
  points so far (Standardize outcome transform, BoTorch's default priors), refitted by
  ``fit_gpytorch_mll`` every iteration; ``random`` — uniform points, for scale. All methods of a
  seed share the function, the starting points and the noise draws.
- **Metric**: simple regret ``f* − max f(x_i)`` over the points evaluated so far (noise-free f;
  f* is the maximum over a 201 × 201 grid, then polished by L-BFGS-B from the grid's best point).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd
import torch

from fedgp.data import ClientData, Federation
from fedgp.errors import import_extra
from fedgp.experiments.common import Report, fit_study, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.models import GPSpec
from fedgp.rng import generator
from fedgp.run import FitResult
from fedgp.strategies import FGPR

__all__ = ["FourierDraw", "botorch_loop_study", "summary", "reproduce", "METHODS"]

LENGTHSCALE, OUTPUTSCALE, NOISE = 0.15, 1.0, 1e-3
DIM, CLIENTS, POINTS, START = 2, 20, 40, 3
#: The compared methods: the federated prior, BoTorch's own fit on the new client's points, random search.
METHODS = ("federated", "local", "random")


@dataclass(frozen=True)
class FourierDraw:
    """``f(x) = √(2 s² / M) Σ_m w_m cos(ω_mᵀ x / ℓ + b_m)``: approximately a draw from GP(0, s² RBF_ℓ)."""

    omega: torch.Tensor  # (M, d)
    phase: torch.Tensor  # (M,)
    weight: torch.Tensor  # (M,)

    @classmethod
    def sample(cls, rng: np.random.Generator, features: int = 1000, d: int = DIM) -> FourierDraw:
        """A random-Fourier-feature draw from the study's GP prior (``features`` features in ``d``
        dimensions)."""
        t = lambda a: torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
        return cls(
            t(rng.standard_normal((features, d))),
            t(rng.uniform(0, 2 * np.pi, features)),
            t(rng.standard_normal(features)),
        )

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        scale = (2 * OUTPUTSCALE / len(self.weight)) ** 0.5
        return scale * torch.cos(X @ self.omega.T / LENGTHSCALE + self.phase) @ self.weight

    def maximum(self) -> float:
        """f* from a 201 × 201 grid, polished with L-BFGS-B from the grid's best point."""
        from scipy.optimize import minimize

        grid = torch.linspace(0, 1, 201, dtype=torch.float64)
        G = torch.cartesian_prod(grid, grid)
        values = self(G)
        start = G[int(values.argmax())].numpy()
        res = minimize(
            lambda x: -float(self(torch.as_tensor(x).unsqueeze(0))),
            start,
            bounds=[(0.0, 1.0)] * DIM,
            method="L-BFGS-B",
        )
        return max(float(values.max()), -float(res.fun))


def _federation(seed: int) -> Federation:
    rng = generator(seed, "botorch-loop federation")
    clients = []
    for k in range(CLIENTS):
        f = FourierDraw.sample(rng)
        X = torch.as_tensor(rng.uniform(size=(POINTS, DIM)), dtype=torch.float64)
        y = f(X) + NOISE**0.5 * torch.as_tensor(rng.standard_normal(POINTS), dtype=torch.float64)
        clients.append(ClientData(X, y, id=k))
    return Federation(clients)


def _spec() -> GPSpec:
    return GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=DIM)))


def federated_prior(seed: int, rounds: int = 60, engine: str = "batched") -> FitResult:
    """FGPR on the 20 clients of ``seed``."""
    strategy = FGPR.authors(local_steps=5, batch_size=20, lr=0.05)
    fed = _federation(seed)
    # Transforms off, as in the committed run: the functions are already on [0, 1]² with unit scale.
    return fit_study(_spec(), fed, strategy, rounds, seed, engine)


def _local_model(X: torch.Tensor, y: torch.Tensor):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP

    model = SingleTaskGP(X, y.unsqueeze(-1))
    fit_gpytorch_mll(gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model))
    return model.eval()


def _next_point(model, y: torch.Tensor, seed: int, it: int) -> torch.Tensor:
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.optim import optimize_acqf

    bounds = torch.stack([torch.zeros(DIM), torch.ones(DIM)]).to(torch.float64)
    torch.manual_seed(int(generator(seed, "botorch-loop acqf", it).integers(2**31)))  # BoTorch's raw samples
    candidate, _ = optimize_acqf(
        qLogExpectedImprovement(model, best_f=y.max()), bounds, q=1, num_restarts=4, raw_samples=128
    )
    return candidate.detach()


def run_seed(
    seed: int, iterations: int = 10, rounds: int = 60, methods=METHODS, engine: str = "batched"
) -> list[dict]:
    """Regret after every iteration, per method, for one seed."""
    import_extra("botorch", "the botorch-loop study")  # before the federated prior's minutes of training
    began = time.perf_counter()
    prior = federated_prior(seed, rounds, engine) if "federated" in methods else None
    fit_seconds = time.perf_counter() - began
    rng = generator(seed, "botorch-loop new client")
    f = FourierDraw.sample(rng)
    f_star = f.maximum()
    X0 = torch.as_tensor(rng.uniform(size=(START, DIM)), dtype=torch.float64)
    noise = NOISE**0.5 * torch.as_tensor(rng.standard_normal(START + iterations), dtype=torch.float64)
    uniform = torch.as_tensor(rng.uniform(size=(iterations, DIM)), dtype=torch.float64)
    rows = []
    for method in methods:
        began = time.perf_counter()
        X, y = X0.clone(), f(X0) + noise[:START]
        for it in range(iterations + 1):
            best = float(f(X).max())
            rows.append(
                {
                    "seed": seed,
                    "method": method,
                    "iteration": it,
                    "evaluations": len(X),
                    "best_f": best,
                    "f_star": f_star,
                    "regret": f_star - best,
                    "seconds": time.perf_counter() - began + (fit_seconds if method == "federated" else 0.0),
                }
            )
            if it == iterations:
                break
            if method == "random":
                x = uniform[it : it + 1]
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # BoTorch's input-scaling and fit-retry warnings
                    if method == "federated":
                        model = prior.to_botorch(ClientData(X, y, id="new"))
                    else:
                        model = _local_model(X, y)
                    x = _next_point(model, y, seed, it)
            X = torch.cat([X, x])
            y = torch.cat([y, f(x) + noise[START + it : START + it + 1]])
    if prior is not None:
        learned = prior.state.to_dict()
        for row in rows:
            row.update({f"learned.{k}": v for k, v in learned.items()})
    return rows


def botorch_loop_study(seeds=range(10), iterations: int = 10, rounds: int = 60) -> pd.DataFrame:
    """One row per (seed, method, iteration)."""
    return pd.DataFrame([row for s in seeds for row in run_seed(s, iterations, rounds)])


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard error of the regret per method after the start and after the last iteration,
    and the number of seeds on which ``federated`` ends with a lower regret than ``local``."""
    last = frame["iteration"].max()
    rows = []
    for method, group in frame.groupby("method", sort=False):
        start, end = (group[group["iteration"] == i]["regret"] for i in (0, last))
        rows.append(
            {
                "method": method,
                "seeds": len(end),
                "regret_start": float(start.mean()),
                f"regret_after_{last}": float(end.mean()),
                "standard_error": float(end.std(ddof=1) / np.sqrt(len(end)))
                if len(end) > 1
                else float("nan"),
                "median": float(end.median()),
                "seconds_per_seed": float(group.groupby("seed")["seconds"].max().mean()),
            }
        )
    out = pd.DataFrame(rows)
    final = frame[frame["iteration"] == last].pivot(index="seed", columns="method", values="regret")
    if {"federated", "local"} <= set(final):
        out.attrs["federated_wins"] = int((final["federated"] < final["local"]).sum())
    return out


def reproduce(repeats, out_dir: Path, seed: int = 0, quick: bool = False, progress=None) -> list[Path]:
    """``fedgp reproduce botorch-loop``: results/botorch_loop.csv and botorch_loop.md."""
    repeats = (1 if quick else 10) if repeats is None else repeats
    iterations, rounds = (2, 10) if quick else (10, 60)

    def report(frame: pd.DataFrame, minutes: float) -> Report:
        table = summary(frame)
        curve = frame.pivot_table(index="iteration", columns="method", values="regret", aggfunc="mean")
        wins = table.attrs.get("federated_wins")
        text = (
            f"# BoTorch loop on a new client: federated prior vs its own points ({repeats} seeds from "
            f"{seed}, {iterations} iterations, {minutes:.1f} min)\n\n"
            + markdown_table(table)
            + (
                f"\n\nFederated ends with a lower regret than local on {wins} of {repeats} seeds.\n"
                if wins is not None
                else "\n"
            )
            + "\nMean regret per iteration:\n\n"
            + markdown_table(curve.reset_index())
            + "\n"
        )
        return Report({"botorch_loop.csv": frame}, {"botorch_loop.md": text})

    study = partial(botorch_loop_study, range(seed, seed + repeats), iterations, rounds)
    return reproduction(out_dir, study, report)
