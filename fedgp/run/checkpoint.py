"""Checkpoints: everything needed to continue a run and end at a bit-identical result, and nothing
that can run code when read.

A checkpoint holds the completed round count, the server state, the history and failures so far,
what the callbacks keep (the stopping rule's memory), what the clients keep (their personal
hyper-parameters, by client id: :mod:`fedgp.run.kept`) and a *fingerprint* of the run it belongs to.
The RNG "state" is only the master seed, because every random draw is a function of
``(seed, stream, round, client)`` (see :mod:`fedgp.rng`).

The file is fedgp's one container (:mod:`fedgp.messages.container`, format ``"checkpoint"``)
sealed with the SHA-256 of its payload (with ``key=``, its HMAC-SHA256 under that key: without a key
the seal detects damage, not forgery), which is checked before anything is parsed; every field is
checked against :mod:`fedgp.models.limits` (and on resume, the server state and history against the
resuming run's, :mod:`fedgp.run.stored`); the server
state is rebuilt by :mod:`fedgp.messages.codec` (plain values, tensors, registered or fedgp's own
dataclasses; nothing imported). Files are written to a temporary file, fsync'ed, then renamed
over the destination (:mod:`fedgp.files`), so a killed process leaves the old checkpoint or the
new one, never half of one. Checkpoints of earlier formats (format 2: ``FEDGP-CHECKPOINT 2``;
format 1: ``torch.save`` pickles) are refused unread, by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedgp.errors import CheckpointError, FileFormatError, MissingFileError
from fedgp.files import write_atomically
from fedgp.messages.codec import decode, encode
from fedgp.messages.container import check_key, pack, seal, unpack, unseal
from fedgp.models import limits
from fedgp.run.kept import kept_record

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "fingerprint_mismatches", "FORMAT_VERSION"]

#: The version of the checkpoint layout this fedgp writes and reads.
FORMAT_VERSION = 3
_FORMAT = "checkpoint"


@dataclass
class Checkpoint:
    """``fingerprint``: field name -> a string describing the run (:meth:`fedgp.run.Run.fingerprint`);
    resume compares it field by field and refuses any difference. ``callbacks``: what each callback
    with a ``checkpoint_key`` keeps (:class:`fedgp.run.Callback`)."""

    completed_rounds: int
    server_state: Any
    history: list[dict[str, Any]]
    fingerprint: dict[str, str] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    callbacks: dict[str, Any] = field(default_factory=dict)
    #: What each client keeps between rounds (its personal hyper-parameters) by client id, as
    #: :meth:`fedgp.engines.Engine.read_client_memory` gives it; ``None`` for a strategy that keeps
    #: nothing. In the file: :mod:`fedgp.run.kept`'s record (checked against the run at resume).
    client_memory: dict[Any, dict[str, torch.Tensor]] | None = None


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint, key: bytes | str | None = None) -> None:
    """Write ``checkpoint`` to ``path`` atomically, sealed with the SHA-256 of its payload, or with
    ``key`` its HMAC-SHA256 under that key."""
    tensors: dict[str, torch.Tensor] = {}
    header = {
        "completed_rounds": int(checkpoint.completed_rounds),
        "server_state": encode(checkpoint.server_state, tensors, "server_state"),
        "history": encode(checkpoint.history, tensors, "history"),
        "failures": encode(checkpoint.failures, tensors, "failures"),
        "callbacks": encode(checkpoint.callbacks, tensors, "callbacks"),
        "fingerprint": {str(k): str(v) for k, v in checkpoint.fingerprint.items()},
    }
    if checkpoint.client_memory is not None:
        kept = checkpoint.client_memory
        header["client_memory"] = encode(kept_record(kept, list(kept)), tensors, "client_memory")
    write_atomically(Path(path), seal(pack(_FORMAT, FORMAT_VERSION, header, tensors), key))


def load_checkpoint(path: str | os.PathLike, key: bytes | str | None = None) -> Checkpoint:
    """Read and verify a checkpoint; :class:`~fedgp.errors.CheckpointError` says what is wrong, naming
    the file and the field. ``key``: the key it was written with (see :func:`save_checkpoint`)."""
    check_key(key)
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"no checkpoint at {path}")
    if path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is a directory, not a checkpoint file")
    data = path.read_bytes()
    if data[:4] == b"PK\x03\x04" or data[:1] == b"\x80":
        raise CheckpointError(
            f"{path} is a checkpoint of fedgp's format 1 (a torch.save pickle). It is refused unread: "
            f"unpickling a file can run arbitrary code. This fedgp reads format {FORMAT_VERSION}: re-run "
            "the fit to write one."
        )
    if data.startswith(b"FEDGP-CHECKPOINT "):
        old = data[len(b"FEDGP-CHECKPOINT ") :].split(b" ", 1)[0].decode(errors="replace")
        raise CheckpointError(
            f"{path} is a checkpoint of fedgp's format {old}; this fedgp reads format {FORMAT_VERSION}. "
            "Re-run the fit with this fedgp to write one."
        )
    try:
        header, tensors = unpack(unseal(data, str(path), key), _FORMAT, FORMAT_VERSION, str(path))
        return _read(header, tensors)
    except FileFormatError as err:
        raise CheckpointError(str(err) if str(path) in str(err) else f"{path}: {err}") from None
    except Exception as err:  # the checksum passed, so this is a file written by something else
        raise CheckpointError(
            f"{path}: checksum matches but the contents are not a fedgp checkpoint: "
            f"{type(err).__name__}: {err}"
        ) from err


def _read(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Checkpoint:
    """The checkpoint a header and its tensors describe, each field checked (:mod:`fedgp.models.limits`)."""
    limits.check_tensors(tensors)
    fingerprint = header.get("fingerprint")
    if not isinstance(fingerprint, dict) or not all(isinstance(v, str) for v in fingerprint.values()):
        raise FileFormatError("fingerprint must map field names to strings")
    out = Checkpoint(
        completed_rounds=limits.integer(header.get("completed_rounds"), "completed_rounds", 0, 2**62),
        server_state=decode(header["server_state"], tensors),
        history=decode(header["history"], tensors),
        fingerprint=dict(fingerprint),
        failures=decode(header["failures"], tensors),
        callbacks=decode(header["callbacks"], tensors),
        # decoded only: resume checks it against the run (fedgp.run.kept.read_kept)
        client_memory=decode(header["client_memory"], tensors) if "client_memory" in header else None,
    )
    for name in ("history", "failures"):
        rows = getattr(out, name)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise FileFormatError(f"{name} must be a list of rows (dicts)")
    if not isinstance(out.callbacks, dict):
        raise FileFormatError("callbacks must be a dict of callback states")
    return out


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
