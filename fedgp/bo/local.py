"""``LocalBO``: each owner alone — BoTorch's ``SingleTaskGP`` on its own points, refitted every iteration.

The baseline federated BO must beat: BoTorch's defaults (a ``Standardize`` outcome transform, its
default hyper-parameter priors), maximum a posteriori by ``fit_gpytorch_mll`` on the owner's points
only, then the same acquisition and optimiser settings as :class:`~fedgp.bo.FederatedBO`.
"""

from __future__ import annotations

import warnings

from fedgp.bo.acquisition import Acquisition, acquisition_seed
from fedgp.bo.method import Method
from fedgp.errors import import_extra

__all__ = ["LocalBO"]


def local_model(X, y):
    """BoTorch's default ``SingleTaskGP`` on ``(X, y)``, fitted by ``fit_gpytorch_mll``, in eval mode."""
    import_extra("botorch", "fedgp.bo.LocalBO")
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    model = SingleTaskGP(X, y.unsqueeze(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BoTorch's input-scaling and fit-retry warnings
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    return model.eval()


class LocalBO(Method):
    """Every owner on its own: ``acquisition`` as :class:`~fedgp.bo.FederatedBO`'s."""

    name = "local"
    stateless = True  # refits on the owners' rows every iteration

    def __init__(self, acquisition=None):
        import_extra("botorch", "fedgp.bo.LocalBO")
        self.acquisition = Acquisition.of("qlogei" if acquisition is None else acquisition)

    def propose(self, loop, iteration: int) -> list:
        out = []
        for k, owner in enumerate(loop.owners):
            seed = acquisition_seed(loop.seed, k, iteration)
            X, _ = self.acquisition.propose(local_model(owner.X, owner.y), owner.y, owner.bounds, seed)
            out.append(X)
        return out
