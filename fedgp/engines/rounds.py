"""Which fused local round runs an engine's chunks: numba's on the CPU, Triton's on a GPU.

Both take the same :class:`~fedgp.engines.fused.FusedLayout` and arguments and compute the same
numbers (tests: 1e-10); this is where the batched engine picks one, or none (the step-by-step path),
and says why. Triton's module is imported only when a GPU engine needs it.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from fedgp.engines import compiled, fused
from fedgp.engines.hadamard_gp import MULTI_OUTPUT_NOT_FUSED
from fedgp.errors import InputError

__all__ = ["choose", "local_round"]


def choose(
    spec, device: torch.device, gp, minibatch_dtype: torch.dtype, wanted: bool | None
) -> tuple[fused.FusedLayout | None, str | None]:
    """The fused round for an engine: ``(layout, name)``, the name of the module whose
    ``local_round`` runs it — :mod:`fedgp.engines.fused` (numba) on the CPU,
    :mod:`fedgp.engines.triton_round` on a GPU; a name, so that an engine still pickles — or
    ``(None, None)`` (the step-by-step path). ``gp`` is the engine's
    :class:`~fedgp.engines.tensor_gp.BatchedGP` (``None``: client by client); ``wanted`` is the
    engine's ``fused`` argument (``True`` raises, saying why it cannot run)."""
    if wanted is False:
        return None, None
    cpu = device.type == "cpu"
    if gp is None:
        why = "the spec runs client by client with GPyTorch"
    elif getattr(gp, "multi_output", False):
        why = MULTI_OUTPUT_NOT_FUSED
    elif cpu and not compiled.available():
        why = "numba is not installed"
    elif cpu and not gp.compiled:
        why = "the compiled step is off (compiled=False)"
    elif not cpu and importlib.util.find_spec("triton") is None:
        why = f"on {device} it needs Triton (the 'gpu' extra: pip install \"fedgp-gpytorch[gpu]\")"
    elif minibatch_dtype != torch.float64:
        why = "minibatch_dtype is not float64"
    elif not isinstance(found := fused.layout(spec), str):
        return found, "fedgp.engines.fused" if cpu else "fedgp.engines.triton_round"
    else:
        why = found
    if wanted:
        raise InputError(f"fused=True: the fused local round cannot run here: {why}")
    return None, None


def local_round(name: str, *args, **kwargs) -> tuple:
    """Run the round of the module :func:`choose` named (``local_round``'s arguments and results)."""
    return importlib.import_module(name).local_round(*args, **kwargs)
