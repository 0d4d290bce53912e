"""A run's fingerprint: what a checkpoint must match before a run may resume from it.

A flat mapping ``field -> text``, so that a refused resume can name the field that differs
(``spec.covar_module.base_kernel``, ``strategy.lr``, ``federation.data``, ``engine``, ...). Long
values (tensors, data) are recorded as sha256 digests; short ones as their values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import torch

from fedgp.version import __version__

__all__ = ["run_fingerprint"]

_SHOWN = 8  # tensors with at most this many elements are recorded by value, larger ones by digest


def _tensor_text(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    if t.numel() <= _SHOWN:
        return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}={t.reshape(-1).tolist()}"
    digest = hashlib.sha256(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} sha256:{digest.hexdigest()[:16]}"


def _spec_fields(spec) -> dict[str, str]:
    """Every module of the spec: its class, plain settings (e.g. Matérn ``nu``), parameters (the
    initial values) and buffers (constraint bounds, prior parameters, ``active_dims``). Constraints
    and priors are modules themselves, so the walk covers them."""
    out = {
        "spec.dtype": str(spec.dtype),
        "spec.fixed": ",".join(n for n in spec.names if n not in spec.trainable_names),
    }
    for name, module in spec.build().named_modules():
        cls = type(module)
        settings = {
            k: v
            for k, v in sorted(vars(module).items())
            if not k.startswith("_")
            and k != "training"
            and isinstance(v, (bool, int, float, str, type(None)))
        }
        text = f"{cls.__module__}.{cls.__qualname__}"
        if settings:
            text += " " + json.dumps(settings, sort_keys=True, default=str)
        out[f"spec.{name or '<model>'}"] = text
        for pname, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            out[f"spec.{name + '.' if name else ''}{pname}"] = _tensor_text(tensor)
    return out


def _config_fields(value: Any, path: str, out: dict[str, str]) -> None:
    if isinstance(value, dict) and set(value) == {"type", "params"}:
        out[path] = str(value["type"])
        for k, v in value["params"].items():
            _config_fields(v, f"{path}.{k}", out)
    else:
        out[path] = json.dumps(value, sort_keys=True)


def _data_digest(federation) -> str:
    digest = hashlib.sha256()
    for client in federation:
        digest.update(repr(client.id).encode())
        for t in (client.X, client.y, client.X_test, client.y_test):
            digest.update(b"-" if t is None else t.contiguous().numpy().tobytes())
    return digest.hexdigest()


def run_fingerprint(
    spec, strategy, roster, federation, engine: str, seed: int, options: dict[str, str], transform=None
) -> dict[str, str]:
    """The fingerprint of a run; ``options`` are the other result-changing settings, already as
    ``field -> text`` (faults, stopping rule, evaluation), and ``transform`` the learned data
    transform (a dataclass of tensors, :mod:`fedgp.transforms`)."""
    out = {"fedgp.version": __version__, "seed": str(int(seed)), "engine": str(engine)}
    out.update(_spec_fields(spec))
    _config_fields(strategy.to_config(), "strategy", out)
    ids = [repr(i) for i in roster.ids]
    out["federation.clients"] = str(len(ids))
    out["federation.ids"] = hashlib.sha256("\x00".join(ids).encode()).hexdigest()[:16]
    out["federation.sizes"] = _tensor_text(torch.as_tensor(roster.sizes))
    out["federation.data"] = (
        "unavailable (engine given as an instance)" if federation is None else _data_digest(federation)
    )
    out.update(sorted(options.items()))
    for f in dataclasses.fields(transform) if transform is not None else ():
        value = getattr(transform, f.name)
        out[f"transform.{f.name}"] = _tensor_text(value) if isinstance(value, torch.Tensor) else repr(value)
    return out
