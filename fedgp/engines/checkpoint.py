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
payload before parsing anything, and rebuilds the state with :mod:`fedgp.state_codec` (plain values,
tensors and fedgp's own imported dataclasses, or those registered with :func:`register_state_type`):
no pickle, no import, so a checkpoint from an untrusted source is safe to load. Files are written to
a temporary file, fsync'ed, then renamed over the destination, so a killed process leaves the old
checkpoint or the new one, never half of one. Format-1 files (``torch.save`` pickles) are refused unread.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

from fedgp.files import write_atomically
from fedgp.state_codec import StateCodecError, decode, encode, register_state_type

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


# -- files -----------------------------------------------------------------------------------------
def _payload(checkpoint: Checkpoint) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    manifest = {
        "version": FORMAT_VERSION,
        "completed_rounds": int(checkpoint.completed_rounds),
        "server_state": encode(checkpoint.server_state, tensors, "server_state"),
        "history": encode(checkpoint.history, tensors, "history"),
        "fingerprint": {str(k): str(v) for k, v in checkpoint.fingerprint.items()},
    }
    if checkpoint.stopping is not None:
        manifest["stopping"] = encode(checkpoint.stopping, tensors, "stopping")
    return _st_save(tensors, metadata={"fedgp": json.dumps(manifest)})  # key order kept: it is data


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically: safetensors and JSON behind a SHA-256 of the payload,
    which :func:`load_checkpoint` checks before parsing anything."""
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
            server_state=decode(manifest["server_state"], tensors),
            history=decode(manifest["history"], tensors),
            fingerprint=dict(manifest["fingerprint"]),
            stopping=decode(manifest.get("stopping"), tensors),
        )
    except (CheckpointError, StateCodecError) as err:
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
