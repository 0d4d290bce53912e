"""Checkpoints: everything needed to continue a run and end at a bit-identical result, and nothing
that can run code when read.

A checkpoint holds the completed round count, the server state, the history so far and a
*fingerprint* of the run it belongs to. The RNG "state" is only the master seed, because every
random draw is a function of ``(seed, stream, round, client)`` (see :mod:`fedgp.rng`).

File layout (format 2)::

    FEDGP-CHECKPOINT 2 sha256=<hex digest of the payload>\\n
    <payload: a safetensors file; its metadata holds the manifest JSON>

Tensors go through safetensors (a flat table of dtypes, shapes and bytes); the structure of the
server state, the history and the fingerprint are JSON. Reading verifies the checksum of the whole
payload before parsing anything, and rebuilds only plain values, tensors and dataclasses defined in
fedgp (or registered with :func:`register_state_type`) that are already imported: no pickle, no
import, so a checkpoint from an untrusted source is safe to load. Files are written to a temporary
file, fsync'ed, then renamed over the destination, so a killed process leaves the old checkpoint or
the new one, never half of one. Format-1 files (``torch.save`` pickles) are refused unread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

from fedgp.files import write_atomically
from fedgp.models.state import HyperState

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "register_state_type",
    "fingerprint_mismatches",
]

FORMAT_VERSION = 2
_MAGIC = b"FEDGP-CHECKPOINT"
_EXTRA_TYPES: dict[str, type] = {}


class CheckpointError(ValueError):
    """A checkpoint file is damaged, of an old or foreign format, or belongs to another run."""


@dataclass
class Checkpoint:
    """``fingerprint``: field name -> a string describing the run (see :func:`fedgp.fit`); resume
    compares it field by field and refuses any difference."""

    completed_rounds: int
    server_state: Any
    history: list[dict[str, Any]]
    fingerprint: dict[str, str] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    #: A stopping rule's memory (:mod:`fedgp.stopping`): the latest states and, once the rule was
    #: met, its reason; ``None`` for runs without a rule (and files written before rules existed).
    stopping: Any = None


def register_state_type(cls: type) -> type:
    """Allow a dataclass defined outside fedgp (a user strategy's server state) in checkpoints."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass; only dataclasses can be checkpointed")
    _EXTRA_TYPES[_type_name(cls)] = cls
    return cls


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_type(name: str) -> type:
    """The dataclass ``module:qualname`` names, if it is already imported and allowed; never imports."""
    if name in _EXTRA_TYPES:
        return _EXTRA_TYPES[name]
    module_name, _, qualname = name.partition(":")
    allowed = module_name == "fedgp" or module_name.startswith("fedgp.")
    obj: Any = sys.modules.get(module_name) if allowed else None
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    own = isinstance(obj, type) and (obj.__module__ == "fedgp" or obj.__module__.startswith("fedgp."))
    if not (own and dataclasses.is_dataclass(obj)):  # defined in fedgp, not merely reachable from it
        raise CheckpointError(
            f"checkpoint names type {name!r}, which is not an imported fedgp dataclass; a checkpoint can "
            "only rebuild fedgp's own state types (register others with register_state_type)"
        )
    return obj


# -- the value tree: JSON structure + a table of tensors -------------------------------------------
def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value).copy())
        return {"__ndarray__": key}
    if isinstance(value, HyperState):
        return {
            "__hyperstate__": {k: _encode(v, tensors, f"{where}.{k}") for k, v in value.items()},
            "events": {k: list(s) for k, s in value.event_shapes.items()},
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _encode(getattr(value, f.name), tensors, f"{where}.{f.name}")
            for f in dataclasses.fields(value)
        }
        return {"__dataclass__": _type_name(type(value)), "fields": fields}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        items = [
            [_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in value.items()
        ]
        return {"__items__": items}
    raise TypeError(
        f"cannot checkpoint a {type(value).__name__} at {where}: checkpoints hold numbers, strings, "
        "tensors, arrays, lists, tuples, dicts, HyperStates and dataclasses"
    )


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        raise CheckpointError(f"checkpoint: unexpected {type(value).__name__} in the manifest")
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__ndarray__" in value:
        return tensors[value["__ndarray__"]].numpy()
    if "__hyperstate__" in value:
        values = {k: _decode(v, tensors) for k, v in value["__hyperstate__"].items()}
        return HyperState(values, {k: tuple(s) for k, s in value["events"].items()})
    if "__dataclass__" in value:
        cls = _resolve_type(value["__dataclass__"])
        fields = {k: _decode(v, tensors) for k, v in value["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        obj = cls(**{k: v for k, v in fields.items() if k in init})
        for k, v in fields.items():
            if k not in init:
                object.__setattr__(obj, k, v)
        return obj
    if "__tuple__" in value:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    if "__items__" in value:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__items__"]}
    raise CheckpointError(f"checkpoint: unrecognised manifest entry with keys {sorted(value)}")


# -- files -----------------------------------------------------------------------------------------
def _payload(checkpoint: Checkpoint) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    manifest = {
        "version": FORMAT_VERSION,
        "completed_rounds": int(checkpoint.completed_rounds),
        "server_state": _encode(checkpoint.server_state, tensors, "server_state"),
        "history": _encode(checkpoint.history, tensors, "history"),
        "fingerprint": {str(k): str(v) for k, v in checkpoint.fingerprint.items()},
    }
    if checkpoint.stopping is not None:
        manifest["stopping"] = _encode(checkpoint.stopping, tensors, "stopping")
    return _st_save(tensors, metadata={"fedgp": json.dumps(manifest)})  # key order kept: it is data


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    payload = _payload(checkpoint)
    head = _MAGIC + b" %d sha256=%s\n" % (FORMAT_VERSION, hashlib.sha256(payload).hexdigest().encode())
    write_atomically(Path(path), head + payload)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and verify a checkpoint; :class:`CheckpointError` says what is wrong with a bad file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    if path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is a directory, not a checkpoint file")
    data = path.read_bytes()
    if data[:4] == b"PK\x03\x04" or data[:1] == b"\x80":
        raise CheckpointError(
            f"{path} is a checkpoint in fedgp's old format (a torch.save pickle). It is refused unread: "
            "unpickling a file can run arbitrary code. Re-run the fit with this fedgp to write a "
            "format-2 checkpoint."
        )
    line, newline, payload = data.partition(b"\n")
    if not line.startswith(_MAGIC) or not newline:
        raise CheckpointError(f"{path} is not a fedgp checkpoint (it does not start with {_MAGIC.decode()})")
    parts = line[len(_MAGIC) :].split()
    if len(parts) != 2 or not parts[1].startswith(b"sha256="):
        raise CheckpointError(f"{path}: damaged checkpoint header {line[:80]!r}")
    if parts[0] != str(FORMAT_VERSION).encode():
        raise CheckpointError(
            f"{path}: checkpoint format {parts[0].decode(errors='replace')!r}, this fedgp reads format "
            f"{FORMAT_VERSION}"
        )
    expected = parts[1][len(b"sha256=") :].decode(errors="replace")
    actual = hashlib.sha256(payload).hexdigest()
    if actual != expected:
        raise CheckpointError(
            f"{path} is damaged: its contents have sha256 {actual}, but the checkpoint records {expected} "
            "(a truncated copy or a flipped byte). Use an earlier checkpoint or restart the run."
        )
    try:
        tensors = _st_load(payload)
        (header_len,) = struct.unpack("<Q", payload[:8])  # safetensors: u64 header size, JSON header
        manifest = json.loads(json.loads(payload[8 : 8 + header_len])["__metadata__"]["fedgp"])
        checkpoint = Checkpoint(
            completed_rounds=int(manifest["completed_rounds"]),
            server_state=_decode(manifest["server_state"], tensors),
            history=_decode(manifest["history"], tensors),
            fingerprint=dict(manifest["fingerprint"]),
            stopping=_decode(manifest.get("stopping"), tensors),
        )
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None
    except Exception as err:  # checksum passed, so this is a file written by something else
        raise CheckpointError(
            f"{path}: checksum matches but the contents are not a fedgp checkpoint: {err}"
        ) from err
    return checkpoint


def fingerprint_mismatches(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """One line per fingerprint field that differs: ``field (checkpoint: a; this run: b)``."""
    out = []
    for key in sorted(set(saved) | set(current), key=lambda k: (k.split(".")[0], k)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if a != b:
            out.append(f"{key} (checkpoint: {_short(a)}; this run: {_short(b)})")
    return out


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
