"""fedgp: federated Gaussian-process regression on GPyTorch.

Spec + federation + strategy + engine, one ``fit``, a result that predicts per client::

    import fedgp
    draws = fedgp.data.gp_federation(num_clients=20, n=250, d=2, seed=0)
    result = fedgp.fit(draws.spec, draws.federation, fedgp.strategies.FGPR(), rounds=50)
    mean, var = result.predict(X_new, client=3)
"""

from fedgp import aggregators, attacks, clustering, data, export, models, strategies
from fedgp.export.saved import load_result as load
from fedgp.fit import FitResult, fit
from fedgp.models import GPSpec, HyperState

__version__ = "0.1.0"
__all__ = [
    "fit",
    "FitResult",
    "load",
    "GPSpec",
    "HyperState",
    "data",
    "models",
    "strategies",
    "aggregators",
    "attacks",
    "clustering",
    "export",
]
