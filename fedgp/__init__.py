"""fedgp: federated Gaussian-process regression on GPyTorch.

Spec + federation + strategy + engine, one ``fit``, a result that predicts per client::

    import fedgp
    draws = fedgp.data.gp_federation(num_clients=20, n=250, d=2, seed=0)
    result = fedgp.fit(draws.spec, draws.federation, fedgp.strategies.FGPR(), rounds=50)
    mean, var = result.predict(X_new, client=3)
"""

from importlib import metadata as _metadata

from fedgp import aggregators, attacks, clustering, data, export, models, stopping, strategies
from fedgp.export.saved import load_result as load
from fedgp.fit import FitResult, fit
from fedgp.models import GPSpec, HyperState
from fedgp.stopping import ConvergenceWarning

#: The name on PyPI: ``fedgp`` there is an unrelated package, so fedgp is installed as this.
DISTRIBUTION = "fedgp-gpytorch"

#: The installed distribution's version (``pip install fedgp-gpytorch``); a source tree that was
#: never installed has no metadata and says so.
try:
    __version__ = _metadata.version(DISTRIBUTION)
except _metadata.PackageNotFoundError:
    __version__ = "0+unknown"
__all__ = [
    "fit",
    "FitResult",
    "load",
    "GPSpec",
    "HyperState",
    "ConvergenceWarning",
    "data",
    "models",
    "strategies",
    "aggregators",
    "attacks",
    "clustering",
    "export",
    "stopping",
]
