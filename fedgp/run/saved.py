"""``FitResult.save`` and ``fedgp.load``: a fitted model in one file, no pickle.

The file holds what prediction needs and nothing of the clients' data: the spec's description
(:mod:`fedgp.models.spec_io`) and initial values, the strategy's JSON config, the server state,
the roster (client ids, sizes, input dimensions: what the server learned at registration), the
history and failures, the seed, and the data transforms (:mod:`fedgp.transforms`: the learned
input bounds and outcome mean and sd that the state's units refer to).

It is fedgp's one container (:mod:`fedgp.messages.container`, format ``"fit-result"``) sealed
with the SHA-256 of its payload (with ``key=``, its HMAC-SHA256 under that key), which is checked
before anything is parsed; every field is then checked against :mod:`fedgp.models.limits` before
anything is built from it. Loading reads JSON
and tensors only; the spec and strategy are rebuilt from allow-lists and the server state by
:mod:`fedgp.messages.codec` (registered or fedgp's own dataclasses, nothing imported), so a
crafted file cannot run code. Results saved by earlier versions (format version 2: a bare
safetensors file) are refused, naming the version.
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

from fedgp.errors import FileFormatError, InputError, InputTypeError, MissingFileError
from fedgp.files import write_atomically
from fedgp.messages import Roster, decode, encode, from_config
from fedgp.messages.container import pack, seal, unpack, unseal
from fedgp.models import limits
from fedgp.models.spec_io import build_spec, check_round_trip
from fedgp.strategies.base import Strategy
from fedgp.transforms import DataTransform

__all__ = ["write_result", "read_result", "FORMAT", "VERSION"]

#: What a saved result's header says it is.
FORMAT = "fit-result"
#: The version of a saved result's layout (a file of another version is refused, by name).
VERSION = 3


def _frame(frame: pd.DataFrame) -> dict:
    # Python's json writes floats exactly (shortest repr); pandas' to_json rounds to 15 digits.
    return frame.to_dict(orient="split")


def _read_frame(split: Any, name: str) -> pd.DataFrame:
    if not isinstance(split, dict) or set(split) != {"index", "columns", "data"}:
        raise FileFormatError(f"saved {name} must be a table with 'index', 'columns' and 'data'")
    return pd.DataFrame(split["data"], index=split["index"], columns=split["columns"])


def _read_transform(record: Any, tensors: dict[str, torch.Tensor]) -> DataTransform:
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise FileFormatError("saved transforms must be a record with 'settings'")
    settings = dict(record["settings"])
    for name, value in settings.items():
        settings[name] = limits.boolean(value, f"transforms.settings[{name!r}]")
    parts = {k: v for k, v in tensors.items() if k.startswith("transform/")}
    for name, tensor in parts.items():
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise FileFormatError(f"tensor {name!r} must hold finite floating-point numbers")
        if name.endswith("_scale") and not bool((tensor > 0).all()):
            raise FileFormatError(f"tensor {name!r} must be positive (a scale), got {tensor.min().item():g}")
    for axis in ("x", "y"):
        offset, scale = parts.get(f"transform/{axis}_offset"), parts.get(f"transform/{axis}_scale")
        if offset is None and scale is None:
            continue
        # x: one offset and scale per input; y: one each.
        ok = offset is not None and scale is not None and offset.shape == scale.shape
        ok = ok and (offset.dim() == 1 if axis == "x" else offset.dim() <= 1 and offset.numel() == 1)
        if not ok:
            names = f"'transform/{axis}_offset' and 'transform/{axis}_scale'"
            raise FileFormatError(f"tensors {names} do not match (one without the other, or shapes)")
    transform = DataTransform.from_parts(parts, settings)
    note = record.get("note", "")
    if not isinstance(note, str):
        raise FileFormatError(f"transforms.note must be a string, got {type(note).__name__}")
    return dataclasses.replace(transform, note=note)


def _read_roster(record: Any, tensors: dict[str, torch.Tensor]) -> Roster:
    ids = record.get("ids") if isinstance(record, dict) else None
    if not isinstance(ids, list) or len(ids) > limits.MAX_CLIENTS:
        raise FileFormatError(f"roster.ids must be a list of at most {limits.MAX_CLIENTS} client ids")
    if not all(isinstance(i, (int, str)) and not isinstance(i, bool) for i in ids):
        raise FileFormatError("roster.ids must hold ints and strings only")
    if len(set(ids)) != len(ids):
        raise FileFormatError("roster.ids repeats a client id")
    parts = []
    for name in ("sizes", "n_test", "dims"):
        tensor = _tensor(tensors, f"roster/{name}")
        if tensor.dtype not in (torch.int64, torch.int32) or tensor.shape != (len(ids),):
            raise FileFormatError(
                f"tensor 'roster/{name}' must hold one integer per client id ({len(ids)}), "
                f"got {str(tensor.dtype).removeprefix('torch.')} of shape {list(tensor.shape)}"
            )
        if len(ids) and int(tensor.min()) < 0:
            raise FileFormatError(f"tensor 'roster/{name}' holds a negative count")
        parts.append(tensor)
    return Roster(list(ids), *parts)


def _ids(ids: list) -> list:
    out = []
    for i in ids:
        if hasattr(i, "item") and not isinstance(i, (str, bytes)):
            i = i.item()  # numpy / torch scalars
        if not isinstance(i, (int, str)) or isinstance(i, bool):
            raise InputTypeError(f"cannot save client id {i!r}: saved ids must be ints or strings")
        out.append(i)
    return out


def write_result(result, path: str | os.PathLike, key: bytes | str | None = None) -> Path:
    """Write ``result`` (a :class:`~fedgp.run.FitResult`) to ``path`` atomically; returns the path.
    With ``key``, the file is sealed with an HMAC-SHA256 under it (:func:`~fedgp.messages.container.seal`)."""
    spec, roster = result.spec, result.roster
    desc = check_round_trip(spec)
    tensors = {f"spec/initial/{k}": v for k, v in spec.initial_state().items()}
    header = {
        "spec": desc,
        "strategy": result.strategy.to_config(),
        "server_state": encode(result.server_state, tensors, "server_state"),  # numbered entries
        "roster": {"ids": _ids(list(roster.ids))},
        "seed": int(result.seed),
        "history": _frame(result.history),
        "failures": _frame(result.failures),
        "attackers": _ids(list(result.attackers)),
        # The data transforms the state's units refer to, as they travel in a task (fedgp.transforms).
        "transforms": {"settings": result.transform.settings(), "note": result.transform.note},
    }
    tensors.update(result.transform.tensors())
    for name in ("sizes", "n_test", "dims"):
        tensors[f"roster/{name}"] = getattr(roster, name).detach().cpu().to(torch.long)
    path = Path(path)
    write_atomically(path, seal(pack(FORMAT, VERSION, header, tensors), key))
    return path


def read_result(path: str | os.PathLike, key: bytes | str | None = None) -> dict[str, Any]:
    """The parts of a result written by :func:`write_result`, as ``FitResult``'s keyword arguments.
    ``key``: the key it was written with (a keyed file needs it; an unkeyed one refuses one). Every
    field is checked against :mod:`fedgp.models.limits` before it is built; anything wrong is a
    :class:`~fedgp.errors.FileFormatError` naming the file and the field."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"no saved result at {path}")
    data = path.read_bytes()
    if not data.startswith(b"FEDGP "):
        raise FileFormatError(f"{path}: {_older_format(path)}")
    # Both name the file; a bad key= is the caller's error and is raised as it is.
    header, tensors = unpack(unseal(data, str(path), key), FORMAT, VERSION, str(path))
    try:
        parts = _read_parts(header, tensors)
    except InputError as err:  # FileFormatError, and the spec's refusals
        raise FileFormatError(f"{path}: {err}") from None
    except (KeyError, TypeError, ValueError) as err:
        raise FileFormatError(f"{path}: not a readable fedgp result ({type(err).__name__}: {err})") from None
    except Exception as err:  # noqa: BLE001 - the seal matched, so a crafted file: refuse, naming it
        raise FileFormatError(
            f"{path}: its seal matches but its contents are not a readable fedgp result "
            f"({type(err).__name__}: {err})"
        ) from None
    return parts


def _read_parts(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    limits.check_tensors(tensors)
    initial = {
        k.removeprefix("spec/initial/"): v for k, v in tensors.items() if k.startswith("spec/initial/")
    }
    spec = build_spec(header["spec"], initial)
    strategy = from_config(header["strategy"])
    if not isinstance(strategy, Strategy):
        raise FileFormatError(f"the strategy config describes a {type(strategy).__name__}, not a strategy")
    roster = _read_roster(header.get("roster"), tensors)
    history, failures = (_read_frame(header[name], name) for name in ("history", "failures"))
    transform = _read_transform(header.get("transforms"), tensors)
    history.attrs["transforms"] = transform.describe()
    d = None if transform.x_offset is None else transform.x_offset.numel()
    if d is not None and len(roster) and set(roster.dims.tolist()) != {d}:
        raise FileFormatError(f"tensor 'transform/x_offset' has {d} inputs; the roster's clients have others")
    server = decode(header["server_state"], tensors)
    seed = limits.integer(header.get("seed"), "seed", -(2**63), 2**64 - 1)
    attackers = header.get("attackers")
    if not isinstance(attackers, list) or not all(isinstance(a, (int, str)) for a in attackers):
        raise FileFormatError("attackers must be a list of client ids")
    return dict(
        spec=spec, strategy=strategy, federation=None, server_state=server, history=history, seed=seed,
        engine=None, roster=roster, failures=failures, attackers=list(attackers), transform=transform,
    )  # fmt: skip


def _tensor(tensors: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in tensors:
        raise FileFormatError(f"the file does not hold tensor {key!r}")
    return tensors[key]


def _older_format(path: Path) -> str:
    """What an unsealed file is: a result saved by an earlier fedgp (named by its version), or not one."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("fedgp", "{}"))
    except Exception:  # noqa: BLE001 - any reason it cannot be read means it is not an old result
        return "not a saved fedgp result (it does not start with a fedgp seal)"
    return (
        f"a result saved by an earlier fedgp (format version {meta.get('version', '?')}); this fedgp reads "
        f"version {VERSION}: load it with the fedgp that saved it, or fit again and save"
    )
