"""A fitted result outside the training session: save/load without pickle, GPyTorch and BoTorch models.

- :mod:`~fedgp.export.spec_io`: a ``GPSpec`` as an allow-listed declarative description;
- :mod:`~fedgp.export.saved`: ``FitResult.save`` / ``fedgp.load`` (safetensors + JSON);
- :mod:`~fedgp.export.exact_gp`: ``FitResult.to_gpytorch``, a client's conditioned ``ExactGP``;
- :mod:`~fedgp.export.botorch_model`: ``FitResult.to_botorch`` (needs the ``botorch`` extra).
"""

from fedgp.export.saved import load_result, save_result
from fedgp.export.spec_io import build_spec, describe_spec

__all__ = ["save_result", "load_result", "describe_spec", "build_spec"]
