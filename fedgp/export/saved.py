"""``FitResult.save`` and ``fedgp.load``: a fitted model in one safetensors file, no pickle.

The file holds what prediction needs and nothing of the clients' data: the spec's description
(:mod:`fedgp.export.spec_io`) and initial values, the strategy's JSON config, the server state,
the registry (client ids, sizes, input dimensions: what the server learned at registration),
the history and failures, the seed, and the data transforms (:mod:`fedgp.transforms`: the learned
input bounds and outcome mean and sd that the state's units refer to). Tensors are safetensors
entries; everything else is JSON in the file's metadata. Loading reads JSON and tensors only; the
spec and strategy are rebuilt from allow-lists and the server state by :mod:`fedgp.state_codec`
(fedgp's own dataclasses, nothing imported), so a crafted file cannot run code.

A loaded result predicts for any ``ClientData``: the client conditions its personal state (for
clustered strategies: the best of the learned states on its own data) on its own points.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import save

from fedgp.engines.base import Registry
from fedgp.export.spec_io import build_spec, check_round_trip
from fedgp.files import write_atomically
from fedgp.messages.config import from_config
from fedgp.state_codec import decode, encode
from fedgp.strategies.base import Strategy
from fedgp.transforms import DataTransform

__all__ = ["save_result", "load_result", "FORMAT", "VERSION"]

#: What a saved result's header says it is.
FORMAT = "fedgp.FitResult"
#: The version of a saved result's layout (a file of another version is refused, by name).
VERSION = 2


def _tensor(tensors: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in tensors:
        raise ValueError(f"saved file refers to tensor {key!r}, which it does not hold")
    return tensors[key]


def _frame(frame: pd.DataFrame) -> dict:
    # Python's json writes floats exactly (shortest repr); pandas' to_json rounds to 15 digits.
    return frame.to_dict(orient="split")


def _read_frame(split: Any, name: str) -> pd.DataFrame:
    if not isinstance(split, dict) or set(split) != {"index", "columns", "data"}:
        raise ValueError(f"saved {name} must be a table with 'index', 'columns' and 'data'")
    return pd.DataFrame(split["data"], index=split["index"], columns=split["columns"])


def _read_transform(record: Any, tensors: dict[str, torch.Tensor]) -> DataTransform:
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ValueError("saved transforms must be a record with 'settings'")
    parts = {k: v for k, v in tensors.items() if k.startswith("transform/")}
    transform = DataTransform.from_parts(parts, record["settings"])
    return dataclasses.replace(transform, note=str(record.get("note", "")))


def _ids(ids: list) -> list:
    out = []
    for i in ids:
        if hasattr(i, "item") and not isinstance(i, (str, bytes)):
            i = i.item()  # numpy / torch scalars
        if not isinstance(i, (int, str)) or isinstance(i, bool):
            raise TypeError(f"cannot save client id {i!r}: saved ids must be ints or strings")
        out.append(i)
    return out


def save_result(result, path: str | os.PathLike) -> Path:
    """Write ``result`` (a :class:`~fedgp.fit.FitResult`) to ``path``; returns the path."""
    spec, registry = result.spec, result.registry
    desc = check_round_trip(spec)
    server: dict[str, torch.Tensor] = {}
    tensors = {
        f"spec/initial/{k}": v.detach().cpu().contiguous().clone() for k, v in spec.initial_state().items()
    }
    header = {
        "format": FORMAT,
        "version": VERSION,
        "spec": desc,
        "strategy": result.strategy.to_config(),
        "server_state": encode(result.server_state, server, "server_state", prefix="server/"),
        "registry": {"ids": _ids(list(registry.ids))},
        "seed": int(result.seed),
        "history": _frame(result.history),
        "failures": _frame(result.failures),
        "attackers": _ids(list(result.attackers)),
        # The data transforms the state's units refer to, as they travel in a task (fedgp.transforms).
        "transforms": {"settings": result.transform.settings(), "note": result.transform.note},
    }
    tensors.update(server)
    tensors.update({k: v.detach().cpu().contiguous().clone() for k, v in result.transform.tensors().items()})
    for name in ("sizes", "n_test", "dims"):
        tensors[f"registry/{name}"] = (
            getattr(registry, name).detach().cpu().to(torch.long).contiguous().clone()
        )
    path = Path(path)
    write_atomically(path, save(tensors, metadata={"fedgp": json.dumps(header, allow_nan=True)}))
    return path


def load_result(path: str | os.PathLike):
    """Read a result written by :meth:`FitResult.save`: predicts for any ``ClientData``."""
    from fedgp.fit import FitResult  # fit imports this module's caller; import at use

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no saved result at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as err:  # safetensors raises its own error types for malformed files
        raise ValueError(f"{path} is not a safetensors file ({err})") from None
    try:
        header = json.loads(metadata["fedgp"])
    except (KeyError, json.JSONDecodeError):
        raise ValueError(f"{path} holds no fedgp result (no 'fedgp' metadata)") from None
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(
            f"{path}: format {header.get('format')!r} version {header.get('version')!r}, "
            f"expected {FORMAT!r} version {VERSION}"
        )
    initial = {
        k.removeprefix("spec/initial/"): v for k, v in tensors.items() if k.startswith("spec/initial/")
    }
    spec = build_spec(header["spec"], initial)
    strategy = from_config(header["strategy"])
    if not isinstance(strategy, Strategy):
        raise ValueError(f"{path}: the strategy config describes a {type(strategy).__name__}, not a strategy")
    registry = Registry(
        list(header["registry"]["ids"]),
        *(_tensor(tensors, f"registry/{name}") for name in ("sizes", "n_test", "dims")),
    )
    history, failures = (_read_frame(header[name], name) for name in ("history", "failures"))
    transform = _read_transform(header.get("transforms"), tensors)
    history.attrs["transforms"] = transform.describe()
    return FitResult(
        spec,
        strategy,
        None,
        decode(header["server_state"], tensors),
        history,
        int(header["seed"]),
        None,
        registry,
        failures,
        list(header["attackers"]),
        transform,
    )
