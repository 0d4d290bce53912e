"""Baselines FGPR is compared with, usable on their own.

* :class:`FedAvgPolynomial` — FedAvg over a 1-D polynomial least-squares fit (FGPR's NASA baseline).
* :class:`FedAvgMLP` — a multilayer perceptron trained by FedAvg (FGPR's NASA "Neural" baseline).
* :class:`Ditto` — the FedAvg MLP plus λ-regularised personal MLPs, λ chosen on validation rows
  (FGPR's SARCOS baseline).
* :class:`LocalGP` / :class:`CentralGP` — an exact GP per client with no federation, and one exact
  GP on all clients' data pooled (the ceiling).
* :class:`MFDGP` — the multi-fidelity deep GP of Cutajar et al. (2019), centralised (FGPR's Table 1
  "Deep"), on GPyTorch's deep GP module; AR1 and NARGP are in :mod:`fedgp.models.multifidelity`.

The federated ones share one protocol (:class:`FederatedBaseline`): ``fit(federation)`` returns the
model, ``predict(X, client)`` a :class:`fedgp.models.posterior.Prediction` for a client named as a
:class:`fedgp.FitResult` names it (position, id or ``ClientData``). The network and polynomial
baselines are point predictors; their ``Prediction`` is a Gaussian with a held-out residual variance,
so that NLL and coverage can be reported for them. MF-DGP is not federated: ``fit(levels)``,
``predict(X, level)``.
"""

from fedgp.baselines._common import FederatedBaseline
from fedgp.baselines.gp import CentralGP, LocalGP
from fedgp.baselines.mfdgp import MFDGP
from fedgp.baselines.neural import Ditto, FedAvgMLP, fit_ditto
from fedgp.baselines.polynomial import FedAvgPolynomial, legendre_features, select_degree

__all__ = [
    "FederatedBaseline",
    "FedAvgPolynomial",
    "legendre_features",
    "select_degree",
    "FedAvgMLP",
    "Ditto",
    "fit_ditto",
    "LocalGP",
    "CentralGP",
    "MFDGP",
]
