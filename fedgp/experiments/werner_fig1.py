"""The paper's Fig. 1a as GP clients: Myopic-Clustering gets stuck where Federated-Clustering does not.

Three clients with scalar losses written through the step size η (Werner et al., §2.1):
f₁ = x²/(6η); f₂ = 4(x−1)³ + 3(x−1)⁴ + 1 for x < 1 and (x−1)²/(2η) + 1 for x ≥ 1 (a saddle at
x = 1, its minimum 0 at x = 0, shared with f₁); f₃ = (x−2)²/(2η). From x₀ = 1.5 the gradients are
±1/(2η), so any clustering puts {1, 2} apart from {3}, and one step lands at (1, 1, 2). There
client 2's gradient is 0 like client 3's, so Myopic-Clustering joins them and client 2 never leaves
the saddle; Federated-Clustering evaluates everyone at client 2's model, sees g = (1/(3η), 0, −1/η),
keeps 1 and 2 together, and client 2 goes on to 0.

Each loss is a GP client: a mean ``m(x; θ) = s (1 − r_t(θ))`` on inputs ``x = (t, s)`` with
``½ r_t² = f_t``, targets ``y = s`` (s = ±1), the zero kernel and unit noise, so the per-point NLL is
``f_t(θ) + ½ log 2π``. η = 0.1 rather than the figure's 0.5: with η = 0.5 client 2's own minimum
is unstable for gradient descent (f₂'' = 12 at 0 > 2/η); the construction is otherwise the same.
"""

from __future__ import annotations

import math

import gpytorch
import pandas as pd
import torch

from fedgp.clustering import FixedRadius
from fedgp.data import ClientData, Federation
from fedgp.models import GPSpec, ZeroKernel
from fedgp.run import Progress, fit
from fedgp.strategies import FederatedClustering, MyopicClustering

__all__ = ["ETA", "Fig1aMean", "fig1a_problem", "loss", "fig1a_study"]

#: The step size η of Fig. 1a; the clients' losses f_t are defined through it (:func:`loss`).
ETA = 0.1
THETA = "mean_module.theta"


def _r(kind: torch.Tensor, theta: torch.Tensor, eta: float) -> torch.Tensor:
    """r with ½ r² = f_kind(θ)."""
    u = theta - 1
    r1 = theta / math.sqrt(3 * eta)
    right = torch.sqrt(u.clamp_min(0) ** 2 / eta + 2)
    left = math.sqrt(2) * (u + 1) * torch.sqrt(3 * u**2 - 2 * u + 1)  # ½ r² = 4u³ + 3u⁴ + 1
    r2 = torch.where(u >= 0, right, left)
    r3 = (theta - 2) / math.sqrt(eta)
    return torch.where(kind == 1, r1, torch.where(kind == 2, r2, r3))


def loss(client: int, theta: float, eta: float = ETA) -> float:
    """f_client(θ) of Fig. 1a."""
    return float(0.5 * _r(torch.tensor(client), torch.tensor(theta, dtype=torch.float64), eta) ** 2)


class Fig1aMean(gpytorch.means.Mean):
    """``m(x; θ) = s (1 − r_t(θ))`` for ``x = (t, s)``; θ starts at 1.5."""

    def __init__(self, eta: float = ETA):
        super().__init__()
        self.eta = float(eta)
        self.register_parameter("theta", torch.nn.Parameter(torch.tensor([1.5])))

    def forward(self, x) -> torch.Tensor:
        return x[..., 1] * (1 - _r(x[..., 0], self.theta[..., :1], self.eta))


def fig1a_problem(eta: float = ETA) -> tuple[GPSpec, Federation]:
    """The spec and the three clients (ids 1, 2, 3)."""
    clients = [
        ClientData(
            torch.tensor([[t, 1.0], [t, -1.0]], dtype=torch.float64), torch.tensor([1.0, -1.0]).double(), id=t
        )
        for t in (1, 2, 3)
    ]
    noise = "likelihood.noise_covar.noise"
    spec = GPSpec(kernel=ZeroKernel(), mean=Fig1aMean(eta), initial_values={noise: 1.0}, fixed=[noise])
    return spec, Federation(clients)


def fig1a_study(rounds: int = 40, eta: float = ETA, radius: float = 5.0) -> pd.DataFrame:
    """Each client's θ and loss after every round under Myopic-Clustering (k-means, K = 2) and
    Federated-Clustering (TC with a fixed radius between 1/(3η) and 1/η)."""
    spec, federation = fig1a_problem(eta)
    methods = {
        "myopic": MyopicClustering(lr=eta, num_clusters=2),
        "fc": FederatedClustering(lr=eta, radius=FixedRadius(radius)),
    }
    rows = []
    for name, strategy in methods.items():
        trace = [(0, torch.full((3,), 1.5, dtype=torch.float64))]

        def record(run, trace=trace):
            trace.append((run.completed, run.server.states[THETA][:, 0].clone()))

        fit(
            spec,
            federation,
            strategy,
            rounds=rounds,
            engine="sequential",
            transforms=None,
            callbacks=[Progress(False), record],
        )
        for r, theta in trace:
            for i, value in enumerate(theta.tolist()):
                rows.append(
                    {
                        "method": name,
                        "round": r,
                        "client": i + 1,
                        "theta": value,
                        "loss": loss(i + 1, value, eta),
                    }
                )
    return pd.DataFrame(rows)
