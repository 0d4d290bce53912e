"""What a stored state may hold: a file's states checked as a reply's are.

A saved result (:mod:`fedgp.run.saved`) or a checkpoint (:mod:`fedgp.run.checkpoint`) without a key
is sealed with a SHA-256 that anyone can recompute, so its seal proves the bytes are the ones
written, not that a fedgp run wrote them. What it holds is therefore checked as a client's reply
is before it reaches the server (:func:`fedgp.messages.check_reply` on the fields
:func:`fedgp.messages.state_fields` declares): every hyper-parameter state — the shared one, each
cluster's or client's, every round's kept state, the spec's initial values — must name the spec's
hyper-parameters, each float64 of its shape, finite and inside its GPyTorch constraint. The server
state as a whole must have the structure the strategy gives it for this federation (compared with
the state :meth:`~fedgp.strategies.base.Strategy.initialize` makes: as many personal states as
clients, as many cluster states as clusters, the same tensors of the same dtype and shape), and its
other floating-point tensors (an optimiser's moments) must be finite. A file that breaks any of
this is refused at load, naming the field, rather than predicting from a noise of −1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedgp.messages import Record, check_reply, reply_structure, state_fields
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["state_problem", "server_problems", "history_problems"]


def state_problem(state: HyperState, spec: GPSpec, where: str) -> str | None:
    """What is wrong with the stored (possibly batched) ``state`` at ``where``, checked as a reply's
    state is: the spec's hyper-parameters, each float64 of its shape, finite, within its constraint.
    ``None`` when nothing is."""
    batch = state.batch_shape
    rows = math.prod(batch)
    fields = {f"{where}.{k.removeprefix('state/')}": f for k, f in state_fields(spec, "state/").items()}
    tensors = {f"{where}.{k}": v.reshape(rows, *v.shape[len(batch) :]) for k, v in state.items()}
    for name, value in tensors.items():  # a Record holds float64 only: another dtype is refused here
        if name in fields and value.dtype != fields[name].dtype:
            return f"field {name!r} has dtype {value.dtype}, expected {fields[name].dtype}"
    record = Record(tensors)
    structure = reply_structure(record, fields, rows)
    if structure:
        return structure
    for row, reason in enumerate(check_reply(record, fields, rows)):
        if reason is not None:
            which = f" (state {list(map(int, np.unravel_index(row, tuple(batch))))})" if batch else ""
            return reason + which
    return None


def server_problems(server: Any, reference: Any, spec: GPSpec, where: str = "server_state") -> list[str]:
    """What is wrong with a stored server state, against ``reference``, the state the strategy makes
    for the same federation before round 1: every state in it checked by :func:`state_problem`, its
    tensors of the reference's dtype and shape, its states of the reference's batch (one per client,
    per cluster...), its other floating-point tensors finite."""
    out: list[str] = []
    _walk(server, reference, spec, where, out)
    return out


def _walk(value: Any, like: Any, spec: GPSpec, where: str, out: list[str]) -> None:
    if isinstance(value, HyperState):
        problem = state_problem(value, spec, where)
        if problem:
            out.append(problem)
        elif isinstance(like, HyperState) and value.batch_shape != like.batch_shape:
            out.append(
                f"{where} holds states of batch {list(value.batch_shape)}; this strategy keeps "
                f"{list(like.batch_shape)} for this federation"
            )
        return
    if isinstance(value, torch.Tensor):
        if isinstance(like, torch.Tensor) and (value.dtype != like.dtype or value.shape != like.shape):
            out.append(
                f"{where} is a {value.dtype} tensor of shape {list(value.shape)}; this strategy keeps a "
                f"{like.dtype} tensor of shape {list(like.shape)} for this federation"
            )
        elif value.is_floating_point() and not bool(torch.isfinite(value).all()):
            if not isinstance(like, torch.Tensor) or bool(torch.isfinite(like).all()):
                out.append(f"{where} holds a NaN or infinite value")
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        same = type(like) is type(value)
        for f in dataclasses.fields(value):
            _walk(
                getattr(value, f.name),
                getattr(like, f.name) if same else None,
                spec,
                f"{where}.{f.name}",
                out,
            )
        return
    if isinstance(value, dict):
        if isinstance(like, dict) and set(value) != set(like):
            mine, theirs = sorted(map(str, value)), sorted(map(str, like))
            out.append(f"{where} holds entries {mine}; this strategy keeps {theirs}")
            return
        for key, item in value.items():
            _walk(item, like.get(key) if isinstance(like, dict) else None, spec, f"{where}[{key!r}]", out)
        return
    if isinstance(value, (list, tuple)):
        paired = isinstance(like, (list, tuple)) and len(like) == len(value)
        for i, item in enumerate(value):
            _walk(item, like[i] if paired else None, spec, f"{where}[{i}]", out)
        return
    if isinstance(value, float) and not math.isfinite(value):
        if not (isinstance(like, float) and not math.isfinite(like)):
            out.append(f"{where} is {value}, not a finite number")


def history_problems(history: pd.DataFrame, rounds: tuple[int, ...] | None) -> list[str]:
    """What is wrong with a stored history: it has no rows (a run has one per round it ran), a
    ``round`` column that is not increasing round numbers from 1, or kept states (``rounds``, when
    the file has them) of other rounds than its rows'."""
    out = []
    if not len(history):
        out.append("history has no rows; a run's history has one row per round it ran")
    if "round" in history.columns:
        column = history["round"]
        numbers = column.tolist() if str(column.dtype) in ("int64", "int32") else None
        if (
            numbers is None
            or any(b <= a for a, b in zip(numbers, numbers[1:]))
            or (numbers and numbers[0] < 1)
        ):
            out.append(
                f"history column 'round' must hold increasing round numbers from 1, got {column.tolist()[:6]}"
            )
    elif rounds is not None:
        out.append("history has no 'round' column, but the file keeps a state for each of its rounds")
    if rounds is not None and "round" in history.columns and list(rounds) != history["round"].tolist():
        out.append(f"history_states.rounds {list(rounds)[:6]} are not the history's rounds")
    return out
