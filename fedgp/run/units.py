"""A run's history in the data's units, for the people who read ``history.csv``.

``FitResult.history`` holds the hyper-parameters the model learned, in the units it learned them:
on standardised targets and unit-cube inputs when the data transforms were on
(:mod:`fedgp.transforms`). Someone reading a model folder (``fedgp fit --out``, the Flower app's
``out-dir``) wants a noise variance in the target's units and a lengthscale in each feature's.

The run keeps the global state of every round (:class:`RoundStates`, in ``history.attrs["states"]``,
saved with the result), and the table is written from those states with
:meth:`fedgp.transforms.DataTransform.untransform` when it is asked for: units are applied to
states, never parsed back from column names. A history without kept states (a result saved
before they were kept, or a table built by hand) has them rebuilt from its state columns, which
the spec's hyper-parameter names and shapes determine (:meth:`RoundStates.from_columns`).
:func:`fedgp.layout.write_history` writes the table and the units of every column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedgp.errors import InputError
from fedgp.models.spec import CONSTANT, NOISE, OUTPUTSCALE
from fedgp.models.state import HyperState
from fedgp.models.units import DATA_NAMES, STATE_UNITS
from fedgp.transforms import DataTransform

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RoundStates", "history_in_data_units", "table_in_data_units", "state_columns"]

#: History columns holding the training objective: an NLL per point of the transformed target.
_OBJECTIVES = ("train_nll", "objective")


def state_columns(state: HyperState) -> dict[str, tuple[int | None, str, int]]:
    """The history columns of one round's global state, as
    :meth:`fedgp.strategies.base.Strategy.describe` writes them by default: ``name`` or ``name[i]``
    (flat index ``i`` of a hyper-parameter with several entries), ``j/`` before them for state ``j``
    of a batch ``(k,)``; each mapped to ``(j or None, name, i)``."""
    events = state.event_shapes
    batch = state.batch_shape
    if len(batch) > 1:
        raise InputError(
            f"a round's state has batch {tuple(batch)}; the history flattens batches of one dimension"
        )
    out: dict[str, tuple[int | None, str, int]] = {}
    for j in range(batch[0]) if batch else (None,):
        prefix = "" if j is None else f"{j}/"
        for name in state:
            n = events[name].numel()
            for i in range(n):
                out[f"{prefix}{name}" if n == 1 else f"{prefix}{name}[{i}]"] = (j, name, i)
    return out


class RoundStates:
    """The global state after each round: ``rounds`` (the history's ``round`` numbers) and
    ``states``, a :class:`HyperState` of batch ``(len(rounds), *B)`` (``B``: the strategy's batch of
    global states, ``(k,)`` clusters or none).

    It lives in ``FitResult.history.attrs["states"]``, so it is a value that pandas may compare
    and copy freely: immutable, equal when its rounds and tensors are equal, copied as itself."""

    __slots__ = ("rounds", "states")

    def __init__(self, rounds: Sequence[int], states: HyperState):
        rounds = tuple(int(r) for r in rounds)
        batch = states.batch_shape
        if not batch or batch[0] != len(rounds):
            raise InputError(f"RoundStates: {len(rounds)} rounds but states of batch {tuple(batch)}")
        object.__setattr__(self, "rounds", rounds)
        object.__setattr__(self, "states", states)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("RoundStates is immutable")

    def __reduce__(self) -> tuple:
        """Pickled (a scikit-learn estimator holding a result is) and rebuilt through ``__init__``."""
        return (RoundStates, (self.rounds, self.states))

    @classmethod
    def stack(cls, rounds: Sequence[int], states: Sequence[HyperState]) -> RoundStates | None:
        """The states of ``rounds`` stacked, or ``None`` where there are none or they differ in
        names or shapes (a history of such states is read from its columns)."""
        if not states:
            return None
        first = states[0]
        like = (list(first), first.event_shapes, first.batch_shape)
        if any((list(s), s.event_shapes, s.batch_shape) != like for s in states):
            return None
        return cls(rounds, HyperState.stack(states))

    def state(self, position: int) -> HyperState:
        """The state after the ``position``-th kept round."""
        return self.states.index(position)

    @classmethod
    def from_columns(cls, history: pd.DataFrame, names: dict[str, torch.Size]) -> RoundStates | None:
        """The states a history's columns hold (``Strategy.describe``'s default flattening), for the
        hyper-parameters ``names`` (name → event shape, ``spec.event_shapes``): what a result saved
        before the states were kept gives back. ``None`` when the history has no such columns."""
        columns = set(map(str, history.columns))
        k = 0
        while any(f"{k}/{c}" in columns for c in _flat_names(names)):
            k += 1
        prefixes = [f"{j}/" for j in range(k)] if k else [""]
        values, events = {}, {}
        for name, event in names.items():
            flat = _flat_names({name: event})
            if not all(p + c in columns for p in prefixes for c in flat):
                continue
            table = np.stack([history[[p + c for c in flat]].to_numpy(np.float64) for p in prefixes], axis=1)
            value = torch.from_numpy(table).reshape(len(history), *([k] if k else []), *event)
            values[name], events[name] = value, event
        if not values:
            return None
        rounds = history["round"] if "round" in columns else range(1, len(history) + 1)
        return cls(list(rounds), HyperState(values, events))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RoundStates):
            return NotImplemented
        a, b = self.states, other.states
        return (
            self.rounds == other.rounds
            and list(a) == list(b)
            and a.event_shapes == b.event_shapes
            and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
        )

    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> RoundStates:
        return self

    def __deepcopy__(self, memo: dict) -> RoundStates:
        return self

    def __repr__(self) -> str:
        batch = tuple(self.states.batch_shape[1:])
        each = f" of batch {batch}" if batch else ""
        return f"RoundStates({len(self.rounds)} rounds{each}: {', '.join(self.states)})"


def _flat_names(names: dict[str, torch.Size]) -> list[str]:
    out = []
    for name, event in names.items():
        n = torch.Size(event).numel()
        out += [name] if n == 1 else [f"{name}[{i}]" for i in range(n)]
    return out


def round_states(result: Any) -> RoundStates | None:
    """The states a result's history keeps, or rebuilt from its columns where it keeps none."""
    kept = result.history.attrs.get("states")
    if isinstance(kept, RoundStates):
        return kept
    return RoundStates.from_columns(result.history, result.spec.event_shapes)


def history_in_data_units(
    result: Any, features: Sequence[str] | None = None
) -> tuple[pd.DataFrame, dict[str, str]]:
    """``result.history`` (a :class:`~fedgp.run.FitResult`'s) with its hyper-parameter columns in
    the data's units, and the units of its columns (hyper-parameters, objectives, test metrics), as
    ``fedgp fit`` writes them to ``history.csv`` and ``transforms.json``. ``features``: the input
    columns' names (default: ``result.feature_names``, else ``x1``, ``x2``, ...).
    :func:`table_in_data_units` says what each column becomes."""
    if features is None:
        features = result.feature_names
    if features is None:
        d = int(result.roster.dims[0]) if result.roster is not None and len(result.roster) else 0
        if result.transform.x_offset is not None:
            d = result.transform.x_offset.numel()
        features = [f"x{i + 1}" for i in range(d)]
    return table_in_data_units(result.history, round_states(result), result.transform, features)


def table_in_data_units(
    history: pd.DataFrame, states: RoundStates | None, transform: DataTransform, features: Sequence[str]
) -> tuple[pd.DataFrame, dict[str, str]]:
    """``history`` with the state columns of ``states`` replaced by the same states in the data's
    units (:meth:`DataTransform.untransform`), and the units of its columns.

    The model learned on transformed data, ``y' = (y − m) / s`` and ``x'_i = (x_i − a_i) / b_i``
    (the unit cube: ``a`` the lower bounds, ``b`` the ranges). The same GP in the data's units has,
    exactly: noise variance and outputscale ``× s²``; constant mean ``m + s·c`` (column
    ``mean_module.constant``); linear-mean weights ``s·w_i / b_i`` and bias
    ``m + s·(c − Σ w_i a_i / b_i)``; lengthscales ``× b_i``, one column per feature named by it
    (``lengthscale[x1]``; a single shared lengthscale becomes one per feature, as their ranges
    differ); a zero mean is the constant ``m`` (``transforms.json``'s outcome mean). With each
    owner's own standardisation (``Standardize(local=True)``) no value in the target's units
    exists: those columns stay in the model's units and say so in their names
    (``covar_module.outputscale (each owner's standardised y)``), as do the training objective's
    (``train_nll (standardised y)``, the figure the progress bar shows) and any hyper-parameter
    this map does not know (``... (model units)``). The test metrics are in the data's units
    already. A clustered strategy's ``j/`` columns convert per cluster.
    """
    import pandas as pd

    y_model = (
        "each owner's standardised y"
        if transform.y_local
        else ("standardised y" if transform.y_offset is not None else "")
    )
    model = ", ".join(x for x in (y_model, "unit-cube x" if transform.x_offset is not None else "") if x)
    owners = _state_groups(history, states)
    converted = _converted(history, states, transform, features, y_model, model)
    columns: dict[str, Any] = {}
    units: dict[str, str] = {}
    done: set[tuple[int | None, str]] = set()
    for column in history.columns:
        key = owners.get(str(column))
        if key is not None:
            if key not in done:
                done.add(key)
                for name, value, unit in converted[key]:
                    columns[name], units[name] = value, unit
            continue
        name = column
        if column in _OBJECTIVES and y_model:
            name = f"{column} ({y_model})"
            units[name] = f"model units: NLL per training point of the {y_model} (the optimiser's objective)"
        elif str(column).startswith("test_rmse"):
            units[name] = "the target's units"
        elif str(column).startswith("test_nll"):
            units[name] = "the data's units: NLL per test point of the target"
        columns[name] = history[column]
    return pd.DataFrame(columns, index=history.index), units


def _state_groups(history: pd.DataFrame, states: RoundStates | None) -> dict[str, tuple[int | None, str]]:
    """Each state column of ``history`` → ``(j, name)``: its state of the batch and hyper-parameter."""
    if states is None:
        return {}
    present = set(map(str, history.columns))
    flat = state_columns(states.state(0))
    return {c: (j, name) for c, (j, name, _) in flat.items() if c in present}


def _rows(history: pd.DataFrame, states: RoundStates) -> np.ndarray:
    """For each row of ``history``, the position of its round among the kept ones (−1: none)."""
    where = {r: p for p, r in enumerate(states.rounds)}
    if "round" in history.columns:
        return np.array([where.get(int(r), -1) for r in history["round"]], dtype=np.int64)
    if len(history) != len(states.rounds):
        raise InputError(
            f"the history has {len(history)} rows and no 'round' column, and {len(states.rounds)} "
            "states are kept"
        )
    return np.arange(len(history))


def _converted(
    history: pd.DataFrame,
    states: RoundStates | None,
    transform: DataTransform,
    features: Sequence[str],
    y_model: str,
    model: str,
) -> dict[tuple[int | None, str], list[tuple[str, Any, str]]]:
    """``(j, name)`` → its ``(column, values, units)`` in the data's units where a faithful map
    exists; else its model-unit columns, named so."""
    if states is None:
        return {}
    rows = _rows(history, states)
    missing = rows < 0
    take = np.where(missing, 0, rows)

    def per_row(values: torch.Tensor) -> np.ndarray:  # (kept rounds,) → one value per history row
        out = values.detach().to(torch.float64).numpy()[take]
        return np.where(missing, np.nan, out) if missing.any() else out

    data = transform.untransform(states.states, partial=True)
    d = len(features)
    batch = states.states.batch_shape[1:]
    out: dict[tuple[int | None, str], list[tuple[str, Any, str]]] = {}
    for j in range(batch[0]) if batch else (None,):
        prefix = "" if j is None else f"{j}/"
        for name in states.states:
            event = states.states.event_shapes[name]
            target = DATA_NAMES.get(name, name)
            kind = STATE_UNITS.get(target)
            n = event.numel()
            if target in data and _fits(kind, data.event_shapes[target].numel(), n, d):
                v = _entries(data[target], j)
                if kind in ("x", "y/x"):
                    out[(j, name)] = [
                        (f"{prefix}{name}[{f}]", per_row(v[:, i if v.shape[1] == d else 0]), _unit(kind, f))
                        for i, f in enumerate(features)
                    ]
                else:
                    out[(j, name)] = [(prefix + target, per_row(v[:, 0]), _unit(kind, ""))]
                continue
            v = _entries(states.states[name], j)
            flat = [prefix + name] if n == 1 else [f"{prefix}{name}[{i}]" for i in range(n)]
            if transform.is_identity:
                out[(j, name)] = [
                    (c, per_row(v[:, i]), "the data's units (no transform)") for i, c in enumerate(flat)
                ]
                continue
            only_y = name in (NOISE, OUTPUTSCALE, CONSTANT)
            suffix, unit = (y_model, y_model) if only_y else ("model units", model)
            out[(j, name)] = [
                (f"{c} ({suffix})", per_row(v[:, i]), f"model units ({unit})") for i, c in enumerate(flat)
            ]
    return out


def _entries(value: torch.Tensor, j: int | None) -> torch.Tensor:
    """``(rounds, entries)``: a hyper-parameter over the kept rounds (of state ``j`` of a batch)."""
    v = value if j is None else value[:, j]
    return v.reshape(v.shape[0], -1)


def _fits(kind: str | None, converted: int, learned: int, d: int) -> bool:
    """Whether a converted hyper-parameter has the columns the table gives it: one per feature for
    a lengthscale (one shared or one each: ``learned`` in ``(1, d)``) and for linear weights (``d``);
    one column for the others."""
    if kind == "x":
        return learned in (1, d) and converted in (1, d)
    if kind == "y/x":
        return converted == d
    return converted == 1


def _unit(kind: str | None, feature: str) -> str:
    return {
        "y²": "the target's units squared",
        "y": "the target's units",
        "x": f"{feature}'s units",
        "y/x": f"the target's units per unit of {feature}",
    }[kind]
