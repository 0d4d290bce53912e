"""FedAvg polynomial regression in one input: the FGPR paper's NASA baseline (Yue & Kontar §6).

Every client fits ``y = Σ_i β_i P_i(z) + ε`` by local gradient descent on its mean squared error and
the server averages the coefficients (FedAvg, weights ``p_k = N_k / N``). The paper writes the
model in monomials ``x^i``; here the basis is Legendre polynomials on ``z ∈ [-1, 1]`` scaled to be
orthonormal for uniform ``z``. It spans the same functions of each degree (the fitted curve is the
same), but degree-10 monomials on cycles/100 have a Gram matrix so ill-conditioned that gradient
descent would not reach the least-squares fit in any practical number of rounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedgp.baselines._common import check_federation, shared_prediction, stack
from fedgp.data.client import Federation
from fedgp.errors import InputError, NotFittedError
from fedgp.models.posterior import Prediction

__all__ = ["FedAvgPolynomial", "legendre_features", "select_degree"]


def legendre_features(x: torch.Tensor, degree: int, domain: tuple[float, float]) -> torch.Tensor:
    """``sqrt(2i+1) P_i(z)``, i = 0..degree, with ``z`` the affine map of ``domain`` onto [-1, 1]."""
    lo, hi = domain
    z = 2.0 * (x.to(torch.float64) - lo) / (hi - lo) - 1.0
    cols = [torch.ones_like(z), z]
    for n in range(1, degree):
        cols.append(((2 * n + 1) * z * cols[n] - n * cols[n - 1]) / (n + 1))
    basis = torch.stack(cols[: degree + 1], dim=-1)
    return basis * torch.sqrt(2.0 * torch.arange(degree + 1, dtype=torch.float64) + 1.0)


@dataclass
class FedAvgPolynomial:
    """Federated polynomial regression of ``y`` on a single input, by FedAvg over gradient descent.

    Args:
        degree: polynomial degree p (the paper searched 1..20 and found 10 best on C-MAPSS).
        rounds: communication rounds.
        local_steps: full-batch gradient steps per client per round.
        lr: step size on ``½ · mean squared error``; with the orthonormal basis ~0.3 is stable.
        domain: the input interval mapped onto [-1, 1]; default: the smallest and largest input of
            the training clients (each client reports only its own min and max).
        noise_variance: the variance of the Gaussian predictive around the curve (for NLL and
            coverage): the residual variance on held-out clients, e.g. :func:`select_degree`'s
            ``val_mse``; default: the federated training MSE of the fit (optimistic).

    After ``fit``: ``coef_`` (p+1,), ``domain_``, ``history_`` (round, federated training MSE).
    ``predict(X, client)`` is ``N(curve(X), noise_variance)``, the same for every client.
    """

    degree: int = 10
    rounds: int = 300
    local_steps: int = 10
    lr: float = 0.3
    domain: tuple[float, float] | None = None
    noise_variance: float | None = None
    coef_: torch.Tensor | None = field(default=None, init=False, repr=False)
    federation_: Federation | None = field(default=None, init=False, repr=False)
    domain_: tuple[float, float] | None = field(default=None, init=False, repr=False)
    history_: pd.DataFrame | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.degree < 0:
            raise InputError(f"degree must be >= 0, got {self.degree}")
        if self.rounds < 1 or self.local_steps < 1:
            raise InputError("rounds and local_steps must be >= 1")
        if not self.lr > 0:
            raise InputError(f"lr must be positive, got {self.lr}")
        if self.noise_variance is not None and not self.noise_variance > 0:
            raise InputError(f"noise_variance must be positive or None, got {self.noise_variance}")

    def features(self, X: torch.Tensor) -> torch.Tensor:
        """The Legendre features of ``X`` (shape ``(n, 1)``) on the fitted domain."""
        if self.domain_ is None:
            raise NotFittedError("FedAvgPolynomial is not fitted yet; call fit(federation)")
        X = torch.as_tensor(X, dtype=torch.float64)
        if X.dim() != 2 or X.shape[1] != 1:
            raise InputError(
                f"FedAvgPolynomial takes one input: X must have shape (n, 1), got {tuple(X.shape)}"
            )
        return legendre_features(X[:, 0], self.degree, self.domain_)

    def fit(self, federation: Federation) -> FedAvgPolynomial:
        """Fit the polynomial's coefficients by FedAvg over the federation's clients; returns ``self``."""
        check_federation(federation, "FedAvgPolynomial")
        if federation.n_features != 1:
            raise InputError(f"FedAvgPolynomial takes one input; the clients have {federation.n_features}")
        data = stack(federation)
        if self.domain is None:
            lo = min(float(c.X.min()) for c in federation)
            hi = max(float(c.X.max()) for c in federation)
        else:
            lo, hi = map(float, self.domain)
        if not hi > lo:
            raise InputError(f"domain must have hi > lo, got ({lo}, {hi})")
        self.domain_ = (lo, hi)
        Phi = legendre_features(data.X[..., 0], self.degree, self.domain_) * data.mask.unsqueeze(-1)
        n = data.sizes.to(torch.float64)
        # Each client's gradient of ½·MSE is A_k β − b_k: its local sufficient statistics, which
        # it computes once; the server only ever sees the coefficients.
        A = Phi.transpose(1, 2) @ Phi / n.view(-1, 1, 1)
        b = (Phi.transpose(1, 2) @ data.y.unsqueeze(-1)).squeeze(-1) / n.view(-1, 1)
        yy = (data.y**2).sum(1) / n
        beta = torch.zeros(self.degree + 1, dtype=torch.float64)
        p = data.weights
        mse = []
        for _ in range(self.rounds):
            local = beta.expand(len(n), -1).clone()
            for _ in range(self.local_steps):
                grad = (A @ local.unsqueeze(-1)).squeeze(-1) - b
                local = local - self.lr * grad
            beta = (p.unsqueeze(-1) * local).sum(0)
            per_client = (beta @ A @ beta) - 2 * (b @ beta) + yy
            mse.append(float((p * per_client).sum()))
        self.coef_, self.federation_ = beta, federation
        self.history_ = pd.DataFrame({"round": np.arange(1, self.rounds + 1), "train_mse": mse})
        return self

    def curve(self, X: torch.Tensor) -> torch.Tensor:
        """The global polynomial at ``X`` (n, 1): the point prediction every client gets."""
        if self.coef_ is None:
            raise NotFittedError("FedAvgPolynomial is not fitted yet; call fit(federation)")
        return self.features(X) @ self.coef_

    def predict(self, X: torch.Tensor, client: Any = None) -> Prediction:
        """``N(curve(X), noise_variance)`` (:func:`~fedgp.baselines._common.point_prediction`) for
        ``client``: the same for every client, so ``client`` (a position, an id or a ``ClientData``,
        new ones included) is only checked."""
        return shared_prediction(self, self.curve(X), client)

    def mse(self, federation: Federation) -> float:
        """``Σ p_k MSE_k`` of the global polynomial on the clients' (training) data."""
        per = [float(((self.curve(c.X) - c.y) ** 2).mean()) for c in federation]
        return float(np.dot(federation.weights.numpy(), per))


def select_degree(
    fit_federation: Federation,
    validation: Federation,
    degrees: Iterable[int] = range(1, 16),
    **options,
) -> tuple[int, pd.DataFrame]:
    """Fit one :class:`FedAvgPolynomial` per degree on ``fit_federation`` and pick the degree with
    the lowest mean per-client RMSE on the ``validation`` clients' data (whole clients held out, as
    the paper chose p on its training engines). Returns the degree and the table of scores."""
    rows = []
    for degree in degrees:
        model = FedAvgPolynomial(degree=degree, **options).fit(fit_federation)
        rmse = [float(((model.curve(c.X) - c.y) ** 2).mean().sqrt()) for c in validation]
        rows.append(
            {
                "degree": degree,
                "val_rmse_mean": float(np.mean(rmse)),
                "val_mse": model.mse(validation),
                "train_mse": float(model.history_["train_mse"].iloc[-1]),
            }
        )
    table = pd.DataFrame(rows)
    best = int(table.loc[table["val_rmse_mean"].idxmin(), "degree"])
    return best, table
