"""Every exception and warning fedgp raises on purpose, under one base each.

Catch :class:`FedGPError` to catch anything fedgp refused or could not do; catch the built-in
class a program already catches (``ValueError``, ``KeyError``, ``RuntimeError``, ``TypeError``,
``FileNotFoundError``) and fedgp's errors of that kind are caught too: each class below keeps the
built-in it stands for as a second base. Every message says what was wrong and where (the
client, file, field or argument).

This module imports nothing of fedgp, so every layer can raise these without an upward import.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "FedGPError",
    "FedGPWarning",
    "InputError",
    "InputTypeError",
    "UnknownNameError",
    "UnknownClientError",
    "CodecError",
    "FileFormatError",
    "CheckpointError",
    "MissingFileError",
    "DataFileError",
    "DataFileMissing",
    "TableError",
    "UnsupportedSpec",
    "FactorizationError",
    "ConvergenceError",
    "MLEError",
    "NotFittedError",
    "ClientFailure",
    "SimulatedFailure",
    "ClientTimeout",
    "RoundFailedError",
    "EngineError",
    "MissingExtraError",
    "CommandError",
    "ConvergenceWarning",
    "DivergenceWarning",
    "RunWarning",
    "PrivacyBudgetWarning",
    "FallbackWarning",
]


class FedGPError(Exception):
    """The base of every exception fedgp raises on purpose."""


class FedGPWarning(UserWarning):
    """The base of every warning fedgp issues."""


class _PlainKeyError(KeyError):
    """A ``KeyError`` whose message prints as written (``KeyError`` would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# -- what a caller gave ---------------------------------------------------------------------------


class InputError(FedGPError, ValueError):
    """A value given to fedgp is wrong: an argument, a client's data, a setting, a file's field."""


class InputTypeError(FedGPError, TypeError):
    """An argument of the wrong type; the message names the type expected."""


class UnknownNameError(FedGPError, _PlainKeyError):
    """A name fedgp does not know: a hyper-parameter, a task's tensor, a data set's file."""


class UnknownClientError(FedGPError, ValueError, _PlainKeyError):
    """A client no federation or result here knows (by id, position or key)."""


class UnsupportedSpec(InputError):
    """A model specification a component cannot evaluate (e.g. the batched engine's tensor path)."""


# -- files fedgp reads ----------------------------------------------------------------------------


class FileFormatError(InputError):
    """A file or message is damaged, foreign, or of a format version this fedgp does not read."""


class CodecError(FileFormatError):
    """An encoded tree names a type it may not, or refers to a tensor its container does not hold."""


class CheckpointError(FileFormatError):
    """A checkpoint is damaged, of another format, or belongs to another run."""


class MissingFileError(FedGPError, FileNotFoundError):
    """A file fedgp was pointed at does not exist (a checkpoint, a saved model, a client folder)."""


class DataFileError(InputError):
    """A data file is missing, truncated, altered or unreadable.

    The message names the file, the path it was looked for at (and which setting chose that
    folder) and how to obtain a verified copy. ``path`` and ``reason`` (``"missing"``, ``"size"``,
    ``"checksum"``, ``"format"``, ``"download"``, ``"place"``, ``"permission"``) are kept as
    attributes for programs.
    """

    def __init__(self, message: str, *, path: Path | str | None = None, reason: str = "format"):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.reason = reason


class DataFileMissing(DataFileError, FileNotFoundError):
    """A data set's file is not where fedgp looks (also a ``FileNotFoundError``); the message says
    how to get it."""


class TableError(InputError):
    """A table fedgp cannot use; the message names the file and the column, line or owner."""


# -- numerics ---------------------------------------------------------------------------------------


class FactorizationError(InputError):
    """A client's kernel matrix cannot be factorised even with the bounded jitter retries.

    ``clients`` names the clients whose matrices failed, so a batch can drop just them."""

    def __init__(self, message: str, clients: tuple = ()):
        super().__init__(message)
        self.clients = tuple(clients)


class ConvergenceError(FedGPError, RuntimeError):
    """An iterative solve (a large client's conjugate gradients) did not reach its tolerance within its
    iteration budget; the message names the client and the residual reached. (Training that has not
    settled is a :class:`ConvergenceWarning`, not an error.)"""


class MLEError(FedGPError, RuntimeError):
    """Every attempt of a maximum-likelihood fit failed."""


class NotFittedError(FedGPError, RuntimeError):
    """A model was asked to predict before it was fitted."""


# -- a federated run ---------------------------------------------------------------------------------


class ClientFailure(FedGPError, RuntimeError):
    """A client could not complete its task. ``clients`` are the keys of the clients that failed,
    when known, so an engine running a batch can drop just them and carry on with the rest."""

    def __init__(self, message: str, clients=()):
        super().__init__(message)
        self.clients = tuple(int(c) for c in clients)


class SimulatedFailure(ClientFailure):
    """A failure drawn by ``Faults(simulate=p)``: raised inside the client's update, so the real
    failure path runs."""


class ClientTimeout(ClientFailure):
    """A task did not return within the engine's ``timeout``: it was cut off while it ran and left
    to finish on its thread, its reply never read (:mod:`fedgp.engines.deadline`)."""


class RoundFailedError(FedGPError, RuntimeError):
    """Too few clients replied for an exchange to count; ``failures`` maps client ids to reasons.

    ``withheld``: why the exchange's summed fields were not released, when a rule on the fewest
    contributions to a sum withheld them (``Faults(min_contributors=...)``, secure aggregation's
    ``min_nodes``) rather than the clients failing; ``bytes_down``/``bytes_up``: what the exchange
    still sent and received."""

    def __init__(
        self,
        message: str,
        failures: Mapping[Any, str],
        *,
        withheld: str | None = None,
        bytes_down: int = 0,
        bytes_up: int = 0,
    ):
        super().__init__(message)
        self.failures = dict(failures)
        self.withheld = withheld
        self.bytes_down, self.bytes_up = int(bytes_down), int(bytes_up)


class EngineError(FedGPError, RuntimeError):
    """An engine could not do its part: clients that did not register, a node or worker missing."""


class MissingExtraError(FedGPError, ModuleNotFoundError):
    """A feature needs an optional dependency; the message names the ``pip install`` that adds it
    (:func:`missing_extra` writes it, the same in every door: Python, the CLI, the Flower app)."""


class CommandError(FedGPError):
    """A ``fedgp`` command cannot go on; the CLI prints the message alone and exits with status 2."""


# -- warnings ---------------------------------------------------------------------------------------


class ConvergenceWarning(FedGPWarning):
    """``fit`` used its whole round budget without meeting its stopping rule."""


class DivergenceWarning(ConvergenceWarning):
    """``fit`` ended because its training objective was rising: the run did not converge, and
    the message says what to change. A :class:`ConvergenceWarning`, so a filter for that catches it."""


class RunWarning(FedGPWarning, RuntimeWarning):
    """A run took a fallback it says why about (e.g. Phase 1 seeded a centre it could not merge),
    and went on."""


class PrivacyBudgetWarning(FedGPWarning):
    """A run with :class:`fedgp.run.ClientDP` stopped before its round budget because its privacy
    budget ε would be passed; its result is the state of the last round the budget afforded."""


class FallbackWarning(FedGPWarning):
    """fedgp gave a default where an answer was asked for — the shared prior for an owner it holds
    no rows of, an empty evaluation where no client holds a test split, a file that lacks what a
    newer one records — and the message says why and what to do instead (name the owner's rows,
    split the federation, or choose the default explicitly where the door offers that)."""


# -- optional extras ---------------------------------------------------------------------------------

#: The optional extras of the ``fedgp-gpytorch`` distribution (``pip install
#: "fedgp-gpytorch[<extra>]"``) and the modules each one brings, by the name ``import`` uses. A
#: test checks that these are the extras ``pyproject.toml`` declares (``dev`` is all of them).
EXTRAS: dict[str, tuple[str, ...]] = {
    "fast": ("numba",),
    "gpu": ("triton",),
    "ray": ("ray",),
    "flower": ("flwr",),
    "parquet": ("pyarrow",),
    "privacy": ("dp_accounting",),
    "botorch": ("botorch",),
    "sklearn": ("sklearn",),
    "bench": ("statsmodels",),
    "notebooks": ("ipykernel", "nbclient", "nbformat"),
    "docs": ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter", "latex2mathml"),
}


def extra_of(module: str) -> str | None:
    """The extra that brings ``module`` (a dotted name counts by its top-level package), or ``None``."""
    top = module.split(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)


def missing_extra(module: str, needed_by: str, missing: str | None = None) -> MissingExtraError:
    """fedgp's one-line error for ``needed_by`` (a feature: ``"ClientDP"``, ``"fedgp.flower"``,
    ``"reading Parquet"``) when ``module`` cannot be imported: it names the module and the
    ``pip install "fedgp-gpytorch[<extra>]"`` that adds it (a module of no extra is named alone).
    ``missing``: the module that was not found, when it is one ``module`` imports."""
    top = module.split(".")[0]
    extra = extra_of(top)
    if extra is None:
        fix = f": pip install {top}"
    else:
        fix = f' (the {extra!r} extra): pip install "fedgp-gpytorch[{extra}]"'
    lost = missing.split(".")[0] if missing else top
    why = "" if lost == top else f" ({top!r} is there but cannot import {lost!r})"
    return MissingExtraError(f"{needed_by} needs {top!r}{fix}{why}", name=lost)


def import_extra(module: str, needed_by: str) -> ModuleType:
    """``importlib.import_module(module)``, or :func:`missing_extra`'s error when it (or a module
    it imports) is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if isinstance(err, MissingExtraError):
            raise
        raise missing_extra(module, needed_by, err.name) from err
