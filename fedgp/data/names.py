"""Feature names: the input columns a model was trained on, by name, so that columns given in
another order are put back in the model's order instead of being read by position.

Names are recorded where data enter with them — a pandas ``DataFrame`` whose column names are all
strings (as scikit-learn records ``feature_names_in_``), an explicit ``feature_names=``, the CLI's
table, a Flower node's file — and travel with the clients, the federation, the fit result, the saved
file and the exported models. Given named columns, :func:`align` reorders them by name and refuses
missing or extra ones, naming them; an unnamed array (numpy, torch, a ``DataFrame`` with integer
column labels) is taken as it is, in the recorded order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from fedgp.errors import InputError, InputTypeError

__all__ = ["frame_names", "check_names", "align", "order_of", "mismatch", "agreed_names"]

#: The longest feature name accepted (characters); a saved file's names are held to it too.
MAX_NAME_CHARS = 4096


def _some(names: Sequence[str], k: int = 10) -> str:
    shown = ", ".join(map(repr, list(names)[:k]))
    return shown + (f", ... ({len(names)} in all)" if len(names) > k else "")


def frame_names(value: Any, where: str) -> tuple[str, ...] | None:
    """The column names of a ``DataFrame`` when every one is a string (``None`` for any other value,
    and for a frame with no string column name, e.g. ``pd.DataFrame(array)``). A frame that mixes
    string and other labels, or repeats a name, is refused: its columns cannot be matched by name."""
    if not isinstance(value, pd.DataFrame):
        return None
    labels = list(value.columns)
    strings = [isinstance(c, str) for c in labels]
    if not any(strings):
        return None
    if not all(strings):
        others = [c for c, s in zip(labels, strings) if not s]
        raise InputError(
            f"{where}: X's column labels mix strings and other values ({_some(others)}), so its columns "
            "can be matched neither by name nor surely by position; name every column with a string "
            "(X.columns = X.columns.astype(str)) or pass X.to_numpy()"
        )
    return check_names(labels, len(labels), where)


def check_names(names: Any, width: int | None, where: str) -> tuple[str, ...]:
    """``names`` as a tuple of distinct strings, one per input column (``width``, when known)."""
    if (
        isinstance(names, (str, bytes))
        or not isinstance(names, (Sequence, pd.Index))
        and not hasattr(names, "__array__")
    ):
        raise InputTypeError(
            f"{where}: feature_names must be a list of strings, one per input column, got "
            f"{type(names).__name__}"
        )
    names = list(names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise InputTypeError(f"{where}: feature_names must be strings; got {_some(bad)}")
    long = [n for n in names if len(n) > MAX_NAME_CHARS]
    if long:
        raise InputError(
            f"{where}: a feature name is {len(long[0])} characters long; the limit is {MAX_NAME_CHARS}"
        )
    twice = sorted(n for n, k in Counter(names).items() if k > 1)  # one pass: a crafted file may hold 10⁵
    if twice:
        raise InputError(
            f"{where}: feature name(s) {_some(twice)} appear more than once; name each column once"
        )
    if width is not None and len(names) != width:
        raise InputError(f"{where}: {len(names)} feature names for {width} input columns")
    return tuple(names)


def mismatch(given: Sequence[str], recorded: Sequence[str], where: str) -> InputError:
    """The error for columns whose names are not the model's: which are missing, which are extra."""
    given_set, recorded_set = set(given), set(recorded)
    missing = [n for n in recorded if n not in given_set]
    extra = [n for n in given if n not in recorded_set]
    parts = ([f"missing {_some(missing)}"] if missing else []) + (
        [f"not features of the model {_some(extra)}"] if extra else []
    )
    return InputError(
        f"{where}: X's columns are not the model's features ({'; '.join(parts)}). The model was trained "
        f"on {_some(recorded)}, in that order: give X those columns (any order; they are matched by name)"
    )


def order_of(given: Sequence[str], recorded: Sequence[str], where: str) -> list[int] | None:
    """The positions in ``given`` of ``recorded``'s names (``None`` when already in that order); a
    missing or extra name is refused by :func:`mismatch`."""
    if tuple(given) == tuple(recorded):
        return None
    if set(given) != set(recorded) or len(given) != len(recorded):
        raise mismatch(given, recorded, where)
    position = {name: i for i, name in enumerate(given)}
    return [position[name] for name in recorded]


def align(X: Any, recorded: Sequence[str] | None, where: str) -> Any:
    """``X`` with its columns in the ``recorded`` order: a ``DataFrame`` with string column names is
    reordered by name (missing or extra names refused, naming them); anything else — an unnamed
    array, or any ``X`` when no names were recorded — is returned as it is (read by position)."""
    if recorded is None:
        return X
    given = frame_names(X, where)
    if given is None:
        return X
    order = order_of(given, recorded, where)
    return X if order is None else X.iloc[:, order]


def agreed_names(clients: Sequence[Any], given: Sequence[str] | None) -> tuple[str, ...] | None:
    """A federation's feature names: ``given`` and every named client's, which must be the same
    names in the same order (another order is refused, naming the client and both orders)."""
    width = clients[0].n_features
    names = None if given is None else check_names(given, width, "Federation(feature_names=...)")
    source = "feature_names="
    for client in clients:
        if client.feature_names is None:
            continue
        if names is None:
            names, source = client.feature_names, f"client {client.id!r}"
        elif client.feature_names != names:
            raise InputError(
                f"client {client.id!r} names its columns {list(client.feature_names)}, but {source} names "
                f"them {list(names)}: every client of a federation must hold the same columns in the same "
                f"order (build its X as X[{list(names)}])"
            )
    return names
