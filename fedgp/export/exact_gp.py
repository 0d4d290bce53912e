"""``FitResult.to_gpytorch``: one client's model as a plain GPyTorch ``ExactGP``.

The client's personal state (FGPR: the global one; clustered: its cluster's) is loaded into a
fresh copy of the spec's modules, and the model is conditioned on the client's own training data
and put in eval mode: calling it on inputs gives the same posterior as ``result.posterior``.
GPyTorch switches to iterative solvers above ``max_cholesky_size`` (800 points); fedgp's
predictions are exact at every size, so evaluate larger clients inside
``fedgp.models.exact_settings()`` to match them.
"""

from __future__ import annotations

from typing import Any

from fedgp.models.spec import ExactGPModel


def to_gpytorch(result, client: Any) -> ExactGPModel:
    data = result.client_data(client)
    spec = result.spec
    model = spec.build()
    spec.load(model, result.client_state(client))
    model.set_train_data(data.X.to(spec.dtype), data.y.to(spec.dtype), strict=False)
    return model.eval()
