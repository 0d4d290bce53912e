"""Which prior scaling makes FedAvg find the global MAP? (issue 16)

Each client k minimises the per-point loss ``ℓ_k(θ) / n_k - w log p(θ)`` (``ℓ_k = -log p(y_k | θ)``)
and FedAvg weights the clients by ``n_k / N``. Full-batch FedAvg with one local SGD step and
averaging in the raw space is gradient descent on

    Σ_k (n_k / N) [ℓ_k / n_k - w log p(θ)] = (Σ_k ℓ_k) / N - w log p(θ),

so its fixed point is the global MAP on pooled data, ``(Σ_k ℓ_k - log p(θ)) / N``, exactly when
``w = 1 / N``. GPyTorch's ``ExactMarginalLogLikelihood`` (the default, ``prior_weight=None``)
divides the prior by the batch size instead, ``w = 1 / n_k``: the fixed point is then the MAP of a
prior counted ``K`` times over (once per client), not the pooled MAP.

The table compares both with a centralised GPyTorch MAP fit (L-BFGS on the pooled objective).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import gpytorch
import pandas as pd
import torch

from fedgp.experiments.common import Report, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.models.objective import log_prior, minibatch_nll
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.run import Evaluate, Progress, fit
from fedgp.strategies import FGPR
from fedgp.strategies.local import SGD
from fedgp.synthetic import gp_federation

__all__ = ["prior_spec", "centralised_map", "federated_map", "prior_map_study", "reproduce"]


def prior_spec(prior_weight: float | None = None, initial_values: dict | None = None) -> GPSpec:
    """A scaled RBF with Gamma priors on the lengthscale, outputscale and noise."""
    kernel = gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 6.0)),
        outputscale_prior=gpytorch.priors.GammaPrior(2.0, 2.0),
    )
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=gpytorch.priors.GammaPrior(2.0, 20.0))
    return GPSpec(
        kernel=kernel, likelihood=likelihood, prior_weight=prior_weight, initial_values=initial_values
    )


def centralised_map(spec: GPSpec, federation, rounds: int = 5) -> HyperState:
    """``argmin (Σ_k -log p(y_k | θ) - log p(θ)) / N`` with GPyTorch and L-BFGS, clients' data pooled
    (each client still its own GP: the objective FGPR's clients share)."""
    model = spec.build()
    params = [model.get_parameter(p.raw_name) for p in spec.params if p.trainable]
    data = [(c.X.to(spec.dtype), c.y.to(spec.dtype)) for c in federation]
    total = sum(len(y) for _, y in data)

    def loss() -> torch.Tensor:
        fit = sum(minibatch_nll(model, X, y, prior_weight=0.0) * len(y) for X, y in data)
        return (fit - log_prior(model)) / total

    # Torch's L-BFGS (strong Wolfe), with tolerances at float64 rounding: the reference must be
    # converged far below the differences the comparison looks for.
    optimizer = torch.optim.LBFGS(
        params, max_iter=500, tolerance_grad=1e-13, tolerance_change=1e-15, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        value = loss()
        value.backward()
        return value

    for _ in range(rounds):  # restarted until its tolerances stop it at once
        optimizer.step(closure)
    return spec.read(model)


def federated_map(spec: GPSpec, federation, rounds: int, lr: float, seed: int = 0) -> HyperState:
    """The fixed point of full-batch FedAvg with one local SGD step (gradient descent on the
    weighted sum of the clients' losses), on the batched engine."""
    strategy = FGPR(
        local_steps=1,
        batch_size=None,
        optimizer=SGD(lr=lr, schedule="constant"),
        average_space="raw",
        server_optimizer=None,
    )
    result = fit(
        spec,
        federation,
        strategy,
        rounds=rounds,
        seed=seed,
        engine="batched",
        transforms=None,  # the priors and the centralised MAP are in the data's units
        callbacks=[Evaluate(every=0), Progress(False)],
    )
    return result.state


def prior_map_study(
    sizes=(10, 20, 40, 80), rounds: int = 3000, lr: float = 0.5, seed: int = 0
) -> pd.DataFrame:
    """One row per (hyper-parameter, scaling): the federated fixed point, the centralised MAP and
    their relative difference."""
    federation = gp_federation(num_clients=len(sizes), n=list(sizes), d=1, seed=seed).federation
    total = sum(c.n for c in federation)
    reference = centralised_map(prior_spec(), federation).to_dict()
    rows = []
    for label, weight in (("1/N (global MAP)", 1.0 / total), ("1/n_k (GPyTorch default)", None)):
        fixed_point = federated_map(prior_spec(weight), federation, rounds, lr, seed).to_dict()
        for name, value in fixed_point.items():
            rows.append(
                {
                    "prior_weight": label,
                    "parameter": name,
                    "federated": value,
                    "centralised_map": reference[name],
                    "relative_difference": abs(value - reference[name]) / abs(reference[name]),
                    "clients": len(sizes),
                    "points": total,
                    "rounds": rounds,
                    "lr": lr,
                }
            )
    return pd.DataFrame(rows)


def reproduce(repeats, out_dir: Path, seed: int = 0, quick: bool = False, progress=None) -> list[Path]:
    """``fedgp reproduce prior-map``: results/prior_map.csv and prior_map.md."""

    def report(frame: pd.DataFrame, minutes: float) -> Report:
        text = (
            "# Federated fixed point vs centralised MAP (GPyTorch priors)\n\n"
            + markdown_table(frame, floatfmt=".6g")
            + "\n"
        )
        return Report({"prior_map.csv": frame}, {"prior_map.md": text})

    study = partial(prior_map_study, rounds=300 if quick else 3000, seed=seed)
    return reproduction(out_dir, study, report)
