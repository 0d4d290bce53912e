"""``FitResult.to_botorch``: one client's model as a BoTorch ``SingleTaskGP``, ready for acquisition.

A federated surrogate is there to be optimised. BoTorch's acquisition functions take any BoTorch
``Model``; its ``SingleTaskGP`` accepts our own mean, kernel and likelihood modules, so the
client's conditioned GP is handed over as one: the spec's modules with the client's personal
state loaded, trained on the client's own points, hyper-parameters frozen (``requires_grad`` off,
so the learned prior is what is used, not refitted on a few points), in eval mode. Its
``posterior`` is BoTorch's, with the joint covariance and ``rsample``.

BoTorch standardises outcomes by default; here no outcome transform is attached, because fedgp
already learned the hyper-parameters in the units of the data it was given (BoTorch would
otherwise rescale the targets the learned outputscale and noise refer to).
"""

from __future__ import annotations

from typing import Any


def _botorch():
    try:
        import botorch.models
    except ImportError:
        raise ImportError(
            "to_botorch needs BoTorch, an optional extra: pip install 'botorch==0.18.1' "
            "(or install fedgp with its 'botorch' extra)"
        ) from None
    return botorch.models


def to_botorch(result, client: Any):
    models = _botorch()
    data = result.client_data(client)
    spec = result.spec
    gp = spec.build()
    spec.load(gp, result.client_state(client))
    model = models.SingleTaskGP(
        data.X.to(spec.dtype),
        data.y.to(spec.dtype).unsqueeze(-1),
        likelihood=gp.likelihood,
        covar_module=gp.covar_module,
        mean_module=gp.mean_module,
        outcome_transform=None,
    )
    model.requires_grad_(False)
    return model.eval()
