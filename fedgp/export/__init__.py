"""A client's fitted model outside fedgp: a GPyTorch ``ExactGP`` or a BoTorch ``SingleTaskGP``.

- :mod:`~fedgp.export.exact_gp`: ``FitResult.to_gpytorch``, a client's conditioned ``ExactGP``;
- :mod:`~fedgp.export.botorch_model`: ``FitResult.to_botorch`` (needs the ``botorch`` extra).

Saving and loading a whole result is :meth:`fedgp.FitResult.save` and :func:`fedgp.load`
(:mod:`fedgp.run.saved`).
"""

from fedgp.export.botorch_model import to_botorch
from fedgp.export.exact_gp import to_gpytorch

__all__ = ["to_gpytorch", "to_botorch"]
