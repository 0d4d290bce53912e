"""``FitResult.save`` and ``fedgp.load``: a fitted model in one file, no pickle.

The file holds what prediction needs and nothing of the clients' data: the spec's description
(:mod:`fedgp.models.spec_io`) and initial values, the strategy's JSON config, the server state,
the roster (client ids, sizes, input dimensions: what the server learned at registration), the
history (values, dtypes, index) and all its ``attrs`` (why the run stopped, the privacy accounting,
...), the failures, the attackers, the seed, the input columns' names (``feature_names``) and the data
transforms (:mod:`fedgp.transforms`: the learned input bounds and outcome mean and sd that the
state's units refer to). So a loaded result reads as the result that was saved:
``history.attrs["transforms"]`` is rebuilt from the transforms themselves, and every other attr is
stored as JSON (plain JSON values only: a tuple, a numpy array or an object is refused at ``save``,
naming it, rather than coming back as something else).

It is fedgp's one container (:mod:`fedgp.messages.container`, format ``"fit-result"``) sealed
with the SHA-256 of its payload (with ``key=``, its HMAC-SHA256 under that key), which is checked
before anything is parsed; every field is then checked against :mod:`fedgp.models.limits` before
anything is built from it, and what is built against its schema (:mod:`fedgp.run.stored`: every state
as a reply's is, the server state against the strategy's structure, the history's rounds, every
header field of the version and no tensor that nothing refers to). Loading reads JSON
and tensors only; the spec and strategy are rebuilt from allow-lists and the server state by
:mod:`fedgp.messages.codec` (registered or fedgp's own dataclasses, nothing imported), so a
crafted file cannot run code.

Format versions: 4 (this one) added the feature names, the history's ``attrs`` and column dtypes;
within it, ``history_states`` (optional) holds the global state of every round as tensors
(:class:`~fedgp.run.units.RoundStates`, ``history.attrs["states"]``), from which the history in the
data's units is written. A file without it (written before fedgp kept them) gives the same states
from its history's columns (:meth:`~fedgp.run.units.RoundStates.from_columns`): no value is lost
either way, and a fedgp that does not know the field reads the file as it did, so it needs no new
version.
Version 5 is a version-4 file with the owners' personal hyper-parameters (``personal``,
:mod:`fedgp.run.kept`: each owner's own values, keyed by its client id, which a simulation's user
holds; a deployment's nodes keep theirs, and ``save`` refuses there). Only a result with personal
hyper-parameters is written as version 5, so that a fedgp that does not know them refuses the file
by its version rather than predict every owner under the initial values.
A file of version 3 is still read, with a :class:`~fedgp.errors.FallbackWarning` saying what it
lacks (no feature names: ``predict`` reads columns by position; no stop reason or privacy
accounting); version 2 (a bare safetensors file) and any later version are refused, naming the
version. An older fedgp refuses a version-4 file by its version, so it never drops the names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open

from fedgp.data.names import check_names
from fedgp.errors import FallbackWarning, FileFormatError, InputError, InputTypeError, MissingFileError
from fedgp.files import write_atomically
from fedgp.messages import Roster, ServerContext, decode, encode, from_config
from fedgp.messages.container import pack, seal, unpack, unseal
from fedgp.models import limits
from fedgp.models.spec import GPSpec
from fedgp.models.spec_io import build_spec, check_round_trip
from fedgp.models.state import HyperState
from fedgp.run.kept import kept_record, read_kept
from fedgp.run.stored import history_problems, server_problems, state_problem
from fedgp.run.units import RoundStates
from fedgp.strategies.base import Strategy
from fedgp.transforms import DataTransform

__all__ = ["write_result", "read_result", "FORMAT", "VERSION", "WITH_PERSONAL"]

#: What a saved result's header says it is.
FORMAT = "fit-result"
#: The version of a saved result's layout, written by ``save``.
VERSION = 4
#: The version of a file that holds the owners' personal hyper-parameters (``"personal"``,
#: :mod:`fedgp.run.kept`): an older fedgp refuses it by its version rather than predict every owner
#: under the initial values. A result without them is still written as :data:`VERSION`.
WITH_PERSONAL = 5
#: The versions ``load`` reads (3: no feature names, no history attrs but the transforms).
READS = (3, 4, 5)


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON's own types, numpy scalars as Python's; anything JSON would not give back
    as it is (a tuple, an array, a non-string key, an object) is refused, naming where."""
    if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_)):
        value = value.item()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise InputTypeError(
                f"cannot save {where}: key {bad[0]!r} is not a string (JSON keys are strings, so it would "
                "come back as another key)"
            )
        return {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    hint = "; store a list" if isinstance(value, (tuple, np.ndarray)) else ""
    raise InputTypeError(
        f"cannot save {where}: a {type(value).__name__}; a saved result keeps it as JSON (dicts with string "
        f"keys, lists, strings, numbers, booleans, None), which would not give it back as it is{hint}"
    )


def _frame(frame: pd.DataFrame, name: str) -> dict:
    """A table as JSON: index, columns, rows and each column's dtype (so that it reads back exactly).
    Python's json writes floats exactly (shortest repr); pandas' to_json rounds to 15 digits."""
    dtypes = [str(d) for d in frame.dtypes]
    for column, dtype in zip(frame.columns, dtypes):
        if dtype not in limits.FRAME_DTYPES:
            raise InputTypeError(
                f"cannot save {name} column {column!r} of dtype {dtype}: a saved result's tables hold "
                f"{', '.join(sorted(limits.FRAME_DTYPES))} columns"
            )
    split = frame.to_dict(orient="split")
    index = frame.index
    span = [index.start, index.stop, index.step] if isinstance(index, pd.RangeIndex) else None
    return {**_plain(split, name), "dtypes": dtypes, "range": span}


def _read_frame(split: Any, name: str) -> pd.DataFrame:
    keys = {"index", "columns", "data"}
    if not isinstance(split, dict) or set(split) - {"dtypes", "range"} != keys:
        raise FileFormatError(f"saved {name} must be a table with 'index', 'columns' and 'data'")
    index, columns, data = split["index"], split["columns"], split["data"]
    ok = isinstance(index, list) and isinstance(columns, list) and isinstance(data, list)
    ok = ok and len(data) == len(index) and all(isinstance(r, list) and len(r) == len(columns) for r in data)
    if not ok:
        raise FileFormatError(
            f"saved {name}: 'data' must hold one row of {len(columns)} cells per index entry"
        )
    for where, labels in (("index", index), ("columns", columns)):
        if not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in labels):
            raise FileFormatError(f"saved {name}.{where} must hold ints and strings only")
    limits.plain_json(data, f"saved {name}.data")
    frame = pd.DataFrame(data, index=index, columns=columns)
    span = split.get("range")
    if "dtypes" not in split and index == list(range(len(index))):  # version 3: 0..n-1 was a range
        span = [0, len(index), 1]
    if span is not None:
        ints = (
            isinstance(span, list) and len(span) == 3 and all(type(v) is int and abs(v) < 2**62 for v in span)
        )
        if not (ints and span[2]):
            raise FileFormatError(f"saved {name}.range must be [start, stop, step] (integers, step not 0)")
        if len(range(*span)) != len(index) or index != list(range(*span)):  # the length first: no huge list
            raise FileFormatError(f"saved {name}.range {span} is not its index")
        frame.index = pd.RangeIndex(*span)
    dtypes = split.get("dtypes")
    if dtypes is None:  # format version 3: the dtypes pandas infers
        return frame
    if not isinstance(dtypes, list) or len(dtypes) != len(columns):
        raise FileFormatError(f"saved {name}.dtypes must name one dtype per column ({len(columns)})")
    for position, dtype in enumerate(dtypes):
        if dtype not in limits.FRAME_DTYPES:
            allowed = ", ".join(sorted(limits.FRAME_DTYPES))
            raise FileFormatError(
                f"saved {name}.dtypes[{position}] is {dtype!r}; a saved table holds {allowed}"
            )
        try:
            frame.isetitem(position, frame.iloc[:, position].astype(dtype))
        except (ValueError, TypeError, OverflowError) as err:
            raise FileFormatError(
                f"saved {name} column {columns[position]!r} is not {dtype} ({err})"
            ) from None
    return frame


def _attrs(attrs: dict) -> dict:
    """``history.attrs`` as JSON, but ``transforms``, which the file's transforms describe, and
    ``states``, which ``history_states`` holds as tensors."""
    rest = {k: v for k, v in attrs.items() if k not in ("transforms", "states")}
    out = _plain(rest, "history.attrs")
    size = len(json.dumps(out, allow_nan=True))
    if size > limits.MAX_ATTRS_BYTES:
        raise InputError(
            f"cannot save history.attrs: {size} bytes as JSON; the limit is {limits.MAX_ATTRS_BYTES}"
        )
    return out


def _read_attrs(record: Any, transform: DataTransform) -> dict:
    if not isinstance(record, dict):
        raise FileFormatError("history_attrs must be a JSON object")
    if "transforms" in record:
        raise FileFormatError("history_attrs holds 'transforms', which the file's transforms describe")
    if "states" in record:
        raise FileFormatError("history_attrs holds 'states', which the file's history_states hold")
    return {"transforms": transform.describe(), **limits.plain_json(record, "history_attrs")}


def _states(attrs: dict, tensors: dict[str, torch.Tensor]) -> dict | None:
    """The history's kept states (:class:`~fedgp.run.units.RoundStates`) as a record of tensors."""
    kept = attrs.get("states")
    if kept is None:
        return None
    if not isinstance(kept, RoundStates):
        raise InputTypeError(
            f"cannot save history.attrs['states']: a {type(kept).__name__}; fedgp keeps a RoundStates there"
        )
    return {"rounds": list(kept.rounds), "states": encode(kept.states, tensors, "history_states")}


def _read_states(
    record: Any, tensors: dict[str, torch.Tensor], spec, history: pd.DataFrame
) -> RoundStates | None:
    """The kept states of a file's history, checked against the spec's hyper-parameters and the
    history's rounds; ``None`` for a file without them (written before fedgp kept them)."""
    if record is None:
        return None
    rounds = record.get("rounds") if isinstance(record, dict) else None
    if not isinstance(rounds, list) or not all(type(r) is int for r in rounds):
        raise FileFormatError("history_states.rounds must be a list of round numbers")
    states = decode(record.get("states"), tensors)
    if not isinstance(states, HyperState):
        raise FileFormatError("history_states.states must be a HyperState")
    events = spec.event_shapes
    for name, event in states.event_shapes.items():
        if events.get(name) != event or not states[name].is_floating_point():
            raise FileFormatError(
                f"history_states: {name!r} is not a floating-point hyper-parameter of the spec's shape"
            )
    if len(states.batch_shape) not in (1, 2) or states.batch_shape[0] != len(rounds):
        raise FileFormatError(
            f"history_states: {len(rounds)} rounds but states of batch {list(states.batch_shape)}"
        )
    if "round" in history.columns and not set(rounds) <= set(history["round"].tolist()):
        raise FileFormatError("history_states.rounds names rounds the history does not hold")
    problem = state_problem(states, spec, "history_states")
    if problem:
        raise FileFormatError(problem)
    return RoundStates(rounds, states)


def _read_names(names: Any, roster: Roster, transform: DataTransform) -> tuple[str, ...] | None:
    """The feature names: strings, distinct, one per input of the model (the roster's width)."""
    if names is None:
        return None
    if not isinstance(names, list) or len(names) > limits.MAX_INPUT_DIMS:
        raise FileFormatError(
            f"feature_names must be a list of at most {limits.MAX_INPUT_DIMS} strings or null"
        )
    widths = set(roster.dims.tolist())
    if transform.x_offset is not None:
        widths.add(transform.x_offset.numel())
    width = widths.pop() if len(widths) == 1 else None
    try:
        return check_names(names, width, "feature_names")
    except (InputError, InputTypeError) as err:
        raise FileFormatError(str(err)) from None


def _read_transform(record: Any, tensors: dict[str, torch.Tensor], outputs: int = 0) -> DataTransform:
    """The saved data transforms, for a spec of ``outputs`` outputs (0: a one-output spec): the
    outcome map is one mean and sd, or one per output ``(T,)``; a multi-output spec's input map leaves
    the output column (X's last) as it is."""
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise FileFormatError("saved transforms must be a record with 'settings'")
    settings = dict(record["settings"])
    for name, value in settings.items():
        settings[name] = limits.boolean(value, f"transforms.settings[{name!r}]")
    if outputs and any(settings.values()):  # y_local, the one setting: refused for several outputs at fit
        raise FileFormatError(
            f"transforms.settings {sorted(k for k, v in settings.items() if v)} is set, but a multi-output "
            "spec's outputs are standardised by the federation's mean and sd of each, never each owner's own"
        )
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
        # x: one offset and scale per input; y: one each, or one per output of a multi-output spec.
        ok = offset is not None and scale is not None and offset.shape == scale.shape
        if axis == "x":
            ok = ok and offset.dim() == 1
        elif outputs:
            ok = ok and offset.shape == (outputs,)
        else:
            ok = ok and offset.dim() <= 1 and offset.numel() == 1
        if not ok:
            names = f"'transform/{axis}_offset' and 'transform/{axis}_scale'"
            shape = f"({outputs},), one per output of the spec" if outputs and axis == "y" else "matching"
            raise FileFormatError(
                f"tensors {names} do not match (one without the other, or shapes; expected {shape})"
            )
        if axis == "y" and not outputs:  # one mean and sd: a (1,) pair would read as per output
            parts[f"transform/{axis}_offset"], parts[f"transform/{axis}_scale"] = (
                offset.reshape(()),
                scale.reshape(()),
            )
        if axis == "x" and outputs and (float(offset[-1]) != 0.0 or float(scale[-1]) != 1.0):
            got = f"offset {float(offset[-1]):g}, scale {float(scale[-1]):g}"
            raise FileFormatError(
                "tensors 'transform/x_offset' and 'transform/x_scale' must leave the output column (X's "
                f"last) as it is (offset 0, scale 1), got {got}"
            )
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
    kept = result.history.attrs.get("states")
    problems = history_problems(result.history, kept.rounds if isinstance(kept, RoundStates) else None)
    if problems:  # load would refuse it
        raise InputError(f"cannot save this result: {'; '.join(problems)}")
    desc = check_round_trip(spec)
    tensors = {f"spec/initial/{k}": v for k, v in spec.initial_state().items()}
    header = {
        "spec": desc,
        "strategy": result.strategy.to_config(),
        "server_state": encode(result.server_state, tensors, "server_state"),  # numbered entries
        "roster": {"ids": _ids(list(roster.ids))},
        "seed": int(result.seed),
        "history": _frame(result.history, "history"),
        "history_attrs": _attrs(result.history.attrs),
        # The global state of every round, from which the history in the data's units is written.
        "history_states": _states(result.history.attrs, tensors),
        "failures": _frame(result.failures, "failures"),
        "attackers": _ids(list(result.attackers)),
        "feature_names": None if result.feature_names is None else list(result.feature_names),
        # The data transforms the state's units refer to, as they travel in a task (fedgp.transforms).
        "transforms": {"settings": result.transform.settings(), "note": result.transform.note},
    }
    tensors.update(result.transform.tensors())
    for name in ("sizes", "n_test", "dims"):
        tensors[f"roster/{name}"] = getattr(roster, name).detach().cpu().to(torch.long)
    version = VERSION
    if result.strategy.keeps_client_memory:  # each owner's own values, by its id
        header["personal"] = _personal(result, tensors)
        version = WITH_PERSONAL
    path = Path(path)
    write_atomically(path, seal(pack(FORMAT, version, header, tensors), key))
    return path


def _personal(result, tensors: dict[str, torch.Tensor]) -> dict:
    """The owners' personal values as the file's ``personal`` record; what the file could not give
    back (an owner that is not in the roster, a value that is no personal hyper-parameter) is refused."""
    kept, ids = result.personal_values(), _ids(list(result.roster.ids))
    names = result.strategy.kept_names(result.spec)
    for owner, values in kept.items():
        if owner not in ids or set(values) - names:
            what = f"values {sorted(set(values) - names)}" if owner in ids else "values, but it is no client"
            raise InputError(
                f"cannot save this result: owner {owner!r} keeps {what} of the model's personal "
                f"hyper-parameters {sorted(names)}"
            )
    return encode(kept_record(kept, ids), tensors, "personal")


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
    header, tensors = unpack(unseal(data, str(path), key), FORMAT, READS, str(path))
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
    if header["version"] < VERSION:
        warnings.warn(
            f"{path}: saved by an earlier fedgp (format version {header['version']}), which recorded no "
            "feature names (predict reads X's columns by position, in the training order) and of the "
            "history's attrs only the transforms (no stop reason, no privacy accounting). Save it again "
            "from a new fit to keep them",
            FallbackWarning,
            stacklevel=3,
        )
    return parts


#: What the header of a saved result holds, by format version (``history_states`` is optional: files
#: written before fedgp kept them lack it).
_HEADER = {
    3: ("spec", "strategy", "server_state", "roster", "seed", "history", "failures", "attackers",
        "transforms"),
    4: ("spec", "strategy", "server_state", "roster", "seed", "history", "history_attrs", "failures",
        "attackers", "feature_names", "transforms"),
    5: ("spec", "strategy", "server_state", "roster", "seed", "history", "history_attrs", "failures",
        "attackers", "feature_names", "transforms", "personal"),
}  # fmt: skip
#: The tensors a saved result holds by name (the numbered rest are the header's ``__tensor__`` entries).
_NAMED = {
    "roster/": ("sizes", "n_test", "dims"),
    "transform/": ("x_offset", "x_scale", "y_offset", "y_scale"),
}


def _check_header(header: dict[str, Any]) -> None:
    """Every field the header's version writes is there."""
    missing = [k for k in _HEADER[header["version"]] if k not in header]
    if missing:
        raise FileFormatError(
            f"the header lacks {missing}, which a saved result of version {header['version']} holds"
        )


def _unused(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[str]:
    """The tensors the file holds for nothing: neither one fedgp writes by name nor one the header
    refers to."""
    used, out = set(_references(header)), []
    for name in tensors:
        prefix = next((p for p in (*_NAMED, "spec/initial/") if name.startswith(p)), None)
        known = (
            name in used
            if prefix is None
            else prefix == "spec/initial/" or name[len(prefix) :] in _NAMED[prefix]
        )
        if not known:
            out.append(f"tensor {name!r} is not one a saved result holds (nothing in the file refers to it)")
    return out


def _references(value: Any):
    """The names of the tensors a header refers to (``{"__tensor__": name}`` entries, any depth)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("__tensor__"), str):
                yield node["__tensor__"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _checked_initial(template: GPSpec, initial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The spec's stored initial values, checked as a reply's state is before GPyTorch sets them
    (GPyTorch would refuse a value outside its constraint with its own advice, not the field)."""
    like = template.initial_state()
    if set(initial) != set(like):
        raise FileFormatError(
            f"spec.initial holds {sorted(initial)}; the spec's hyper-parameters are {sorted(like)}"
        )
    problem = state_problem(HyperState(initial, like.event_shapes), template, "spec.initial")
    if problem:
        raise FileFormatError(problem)
    return initial


def _read_parts(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    limits.check_tensors(tensors)
    _check_header(header)
    initial = {
        k.removeprefix("spec/initial/"): v for k, v in tensors.items() if k.startswith("spec/initial/")
    }
    spec = build_spec(header["spec"], _checked_initial(build_spec(header["spec"]), initial))
    strategy = from_config(header["strategy"])
    if not isinstance(strategy, Strategy):
        raise FileFormatError(f"the strategy config describes a {type(strategy).__name__}, not a strategy")
    roster = _read_roster(header.get("roster"), tensors)
    history, failures = (_read_frame(header[name], name) for name in ("history", "failures"))
    transform = _read_transform(header.get("transforms"), tensors, getattr(spec, "outputs", 0))
    history.attrs = _read_attrs(header.get("history_attrs", {}), transform)
    states = _read_states(header.get("history_states"), tensors, spec, history)
    if states is not None:
        history.attrs["states"] = states
    d = None if transform.x_offset is None else transform.x_offset.numel()
    if d is not None and len(roster) and set(roster.dims.tolist()) != {d}:
        raise FileFormatError(f"tensor 'transform/x_offset' has {d} inputs; the roster's clients have others")
    server = decode(header["server_state"], tensors)
    seed = limits.integer(header.get("seed"), "seed", -(2**63), 2**64 - 1)
    attackers = header.get("attackers")
    if not isinstance(attackers, list) or not all(isinstance(a, (int, str)) for a in attackers):
        raise FileFormatError("attackers must be a list of client ids")
    names = _read_names(header.get("feature_names"), roster, transform)
    owner_values = _read_personal(header, tensors, spec, strategy, roster)
    problems = _unused(header, tensors) + history_problems(history, None if states is None else states.rounds)
    reference = strategy.initialize(ServerContext.from_roster(spec, roster, seed), np.random.default_rng(0))
    problems += server_problems(server, reference, spec)
    if problems:
        raise FileFormatError("; ".join(problems[:3]))
    return dict(
        spec=spec, strategy=strategy, federation=None, server_state=server, history=history, seed=seed,
        engine=None, roster=roster, failures=failures, attackers=list(attackers), transform=transform,
        feature_names=names, owner_values=owner_values,
    )  # fmt: skip


def _read_personal(header: dict[str, Any], tensors: dict[str, torch.Tensor], spec, strategy, roster) -> dict:
    """The owners' personal values (a version-5 file's), checked (:func:`~fedgp.run.kept.read_kept`);
    a file whose strategy keeps them must hold them, and only such a file may."""
    keeps, version = strategy.keeps_client_memory, header["version"]
    if "personal" in header and version < WITH_PERSONAL:
        raise FileFormatError(f"personal: a file of version {version} holds no owners' personal values")
    if keeps and version < WITH_PERSONAL:
        raise FileFormatError(
            f"personal: its strategy's owners keep personal hyper-parameters, but the file (version "
            f"{version}) holds none of their values"
        )
    if not keeps and version >= WITH_PERSONAL:
        raise FileFormatError("personal: the file holds owners' personal values, but its strategy keeps none")
    if not keeps:
        return {}
    try:
        record = decode(header["personal"], tensors)
    except Exception as err:  # noqa: BLE001 - a crafted reference: refuse, naming the field
        raise FileFormatError(f"personal is not a record of the file's tensors ({err})") from None
    return read_kept(record, spec, strategy.kept_names(spec), roster.ids, "personal")


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
        f"version {' or '.join(map(str, READS))}: load it with the fedgp that saved it, or fit again and save"
    )
