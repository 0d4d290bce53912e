"""``FitResult``: what a run leaves — the learned state, the history, and prediction per client.

Prediction, evaluation and a client's personal state are exchanges too: the client conditions the
learned prior on its own data and only the answer travels (:func:`fedgp.run.exchange.personal_exchange`).
A result read back by :meth:`FitResult.load` holds no client data and predicts for any
``ClientData`` given to it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from fedgp.data.client import ClientData, Federation, _as_float_tensor, _check_finite
from fedgp.data.names import align, check_names
from fedgp.data.owners import OwnerData
from fedgp.engines.base import Engine, InProcessEngine
from fedgp.engines.sequential import SequentialOps
from fedgp.engines.tasks import KINDS, handle
from fedgp.errors import (
    EngineError,
    FallbackWarning,
    FileFormatError,
    InputError,
    RoundFailedError,
    UnknownClientError,
)
from fedgp.export.botorch_model import to_botorch
from fedgp.export.exact_gp import to_gpytorch
from fedgp.messages import Record, Roster, ServerContext, Task, check_reply, read_state
from fedgp.models.own_features import OwnFeaturesSpec
from fedgp.models.posterior import Prediction
from fedgp.models.spec import ExactGPModel, GPSpec
from fedgp.models.state import HyperState
from fedgp.plotting import plot_history
from fedgp.run.combined import check_experts, combined_posterior
from fedgp.run.evaluation import evaluate_clients
from fedgp.run.exchange import ask, personal_task, send_transform
from fedgp.run.saved import read_result, write_result
from fedgp.run.streaming import current_owner, grow, warm_spec
from fedgp.strategies.base import Strategy
from fedgp.strategies.memory import ClientMemory
from fedgp.transforms import DataTransform

if TYPE_CHECKING:
    from botorch.models import SingleTaskGP
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["FitResult"]


@dataclass
class FitResult:
    """The outcome of :func:`fit`: learned server state, history, and per-client prediction.

    ``history`` has one row per round (metrics, the round's failures and bytes); ``failures`` one
    row per failed client and round, with the reason. ``feature_names`` are the input columns' names
    in the model's order when the federation named them (``None``: known by position only);
    :meth:`posterior` and :meth:`predict` match a ``DataFrame``'s columns to them by name.
    """

    spec: GPSpec
    strategy: Strategy
    federation: Federation | None
    server_state: Any
    history: pd.DataFrame
    seed: int
    engine: Engine | None  # None for a result read back by fedgp.load
    roster: Roster | None = None
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    attackers: list = field(default_factory=list)  # ids of the clients an ``attack`` took over
    transform: DataTransform = field(default_factory=DataTransform)  # applied to every client's data
    feature_names: tuple[str, ...] | None = None  # the input columns, in the model's order
    # each owner's personal hyper-parameters by client id, as a loaded result holds them (a fitted
    # result's engine keeps them): see personal_values
    owner_values: dict = field(default_factory=dict, repr=False, compare=False)
    _model: Any = field(default=None, init=False, repr=False, compare=False)  # new clients' GPyTorch model
    _context: Any = field(default=None, init=False, repr=False, compare=False)
    _conditioned: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # the owners that added rows after fit (update), by position: fedgp.run.streaming.GrownOwner
    _grown: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.feature_names is not None:
            width = None if self.roster is None or not len(self.roster.dims) else int(self.roster.dims[0])
            self.feature_names = check_names(self.feature_names, width, "FitResult(feature_names=...)")

    def __repr__(self) -> str:
        """One line a notebook can show: strategy, rounds, engine, clients, why it stopped, the last
        train NLL (``history`` and ``state`` hold the rest)."""
        parts = [type(self.strategy).__name__, f"rounds={len(self.history)}"]
        if self.engine is not None:
            parts.append(f"engine={getattr(self.engine, 'name', type(self.engine).__name__)!r}")
        if self.roster is not None:
            parts.append(f"clients={len(self.roster.ids)}")
        stop = self.history.attrs.get("stop_reason")
        if stop:  # the reason's head; history.attrs["stop_reason"] has it whole
            parts.append(f"stopped={stop if len(stop) <= 60 else stop[:57] + '...'!r}")
        if "train_nll" in self.history and len(self.history):
            parts.append(f"train_nll={float(self.history['train_nll'].iloc[-1]):.4g}")
        return f"FitResult({', '.join(parts)})"

    @property
    def transforms(self) -> dict[str, str]:
        """What was applied to the outcome and the inputs (predictions are in the original units)."""
        return self.transform.describe()

    @property
    def state(self) -> HyperState:
        """The learned (global) hyper-parameters, in constrained units."""
        return self.strategy.global_state(self.server_state)

    @property
    def context(self) -> ServerContext:
        """What the server knows about this run (spec, clients' ids and sizes, seed), as the strategy saw
        it (built once)."""
        if self._context is None:
            self._context = ServerContext.from_roster(self.spec, self.roster, self.seed)
        return self._context

    def _position(self, client: int | ClientData | Any) -> int | ClientData:
        """The training position of ``client``, or a new client's data in the model's column order.

        An int is a position, a ``ClientData`` of the federation that client, any other
        ``ClientData`` a new client (the server has never seen it), else an id."""
        if isinstance(client, ClientData):
            for i, member in enumerate(() if self.federation is None else self.federation):
                if member is client:
                    return i
            return client.in_order(self.feature_names)
        if self.engine is None:
            raise InputError(
                f"client {client!r}: this result was loaded from a file and holds no client data; "
                "pass the client's ClientData instead"
            )
        ids = self.roster.ids
        if isinstance(client, (int, np.integer)) and not isinstance(client, bool):
            position = int(client)
            if not 0 <= position < len(ids):
                raise UnknownClientError(
                    f"client={position}: no client at that position; the model was trained on "
                    f"{len(ids)} clients, positions 0..{len(ids) - 1} (ids {_some(ids)}). Pass a position, "
                    "an id, or a fedgp.data.ClientData to predict for a new client"
                )
            return position
        try:
            return self.roster.position(client)
        except UnknownClientError:
            raise UnknownClientError(
                f"client={client!r}: no client with id {client!r} among the {len(ids)} trained on "
                f"(ids {_some(ids)}). Pass a position, an id, or a fedgp.data.ClientData to predict for "
                "a new client"
            ) from None

    def ask(
        self, kind: str, client: int | ClientData | Any, X: torch.Tensor | None = None, full_cov: bool = False
    ) -> dict[str, torch.Tensor]:
        """``client``'s answer to a ``kind`` task — ``"predict"`` (at ``X``, in model column order),
        ``"evaluate"`` or ``"personal"`` — one row per reply field (:mod:`fedgp.engines.tasks`).

        A training client answers through the run's engine, from its own data, as a message; a new
        ``ClientData`` is answered here, in this process, as that client would: its data in the
        run's units, the strategy's choice of state for a client the server never saw, no engine and
        no registration. A client that cannot answer raises :class:`~fedgp.errors.EngineError` with
        its reason. (:meth:`posterior` computes a training client's prediction in this process where
        its engine hosts it here, bit for bit what this ``predict`` task answers.)"""
        return self._answer(kind, self._position(client), X, full_cov)

    def _answer(self, kind: str, where: int | ClientData, X, full_cov: bool) -> dict[str, torch.Tensor]:
        """:meth:`ask` through the protocol: a training client through the engine, a new one here, an
        owner that added rows (:meth:`update`) here from its grown factor."""
        if isinstance(where, ClientData):
            return self._ask_new(kind, where, X, full_cov)
        if where in self._grown:
            return self._ask_grown(kind, where, X, full_cov)
        return self._engine_answer(kind, where, X, full_cov)

    def _engine_answer(
        self, kind: str, where: int, X: torch.Tensor | None = None, full_cov: bool = False
    ) -> dict[str, torch.Tensor]:
        """The training client at ``where``'s answer through the run's engine, from the rows it hosts."""
        try:
            outcome = ask(self, kind, torch.tensor([where]), X=X, full_cov=full_cov)
        except RoundFailedError as err:
            (reason,) = err.failures.values()
            raise EngineError(f"client {self.roster.ids[where]!r} could not {kind}: {reason}") from None
        return {name: value[0] for name, value in outcome.individual.items()}

    # -- a training client of an in-process engine, predicting in this process ----------------------
    def _here(self, where: int | ClientData) -> bool:
        """Whether ``where``'s prediction can be computed here, as its engine would: a training client
        hosted in this process by an engine with no loopback (which proves that only records cross)
        and no deadline (which cuts a client off on another thread)."""
        engine = self.engine
        return (
            not isinstance(where, ClientData)
            and isinstance(engine, InProcessEngine)
            and not engine.loopback
            and engine.timeout is None
            and where not in self._grown  # its rows are the result's now: answered from its factor
        )

    def _predict_here(self, position: int, X: torch.Tensor, full_cov: bool) -> Prediction:
        """The posterior of the training client at ``position`` at ``X`` (model columns): what the
        engine's ``predict`` task computes — the client's personal state, conditioned on its data in
        the run's units, back in the data's units — without a message. The personal state is the
        client's own choice, asked once through the protocol (a ``personal`` task) and kept while
        the server state and the engine's units are these."""
        ops, state, offset, scale = self._client_here(position)
        try:
            (prediction,) = ops.predict(state, self.transform.inputs(X).to(self.spec.dtype), full_cov)
        except Exception as err:  # noqa: BLE001 - as an engine reports a client's failure
            reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:500]
            raise EngineError(f"client {self.roster.ids[position]!r} could not predict: {reason}") from None
        if self.transform.per_output:  # a multi-output spec's: each point by its output's map
            return self.transform.untransform_rows(prediction, X)
        return self.transform.untransform(prediction, offset, scale)

    def _client_here(self, position: int) -> tuple[Any, HyperState, torch.Tensor, torch.Tensor]:
        """``(ops, personal state, outcome offset, outcome scale)`` of a training client, kept."""
        engine = self.engine
        if engine.transform_sent is not self.transform:  # another fit ran on the engine since
            send_transform(engine, self.roster, self.transform)
        key = (id(self.server_state), id(engine.transform_sent))
        if self._conditioned.get("key") != key:
            self._conditioned.clear()
            self._conditioned["key"] = key
        if position not in self._conditioned:
            reply = self._answer("personal", position, None, False)
            state = read_state({k: v.unsqueeze(0) for k, v in reply.items()}, self.spec, "state/")
            ops = engine.ops(torch.tensor([position]), 0)
            units = engine.outcome_offset[position], engine.outcome_scale[position]
            self._conditioned[position] = (ops, state, *units)
        return self._conditioned[position]

    def _ask_new(self, kind: str, client: ClientData, X, full_cov: bool) -> dict[str, torch.Tensor]:
        def answer(task: Task) -> dict[str, torch.Tensor]:
            data, offset, scale = self.transform.apply(client)
            if self._model is None:  # one GPyTorch model, reloaded for each new client
                self._model = self.spec.build()
            ops = SequentialOps(self.spec, self._model, data, 0, 0, self.seed)
            kept = self.owner_values.get(client.id) if client.id is not None else None
            if kept:  # a loaded result's owner, by its id: it conditions on its own values, as fitted
                ops.memory = ClientMemory({0: dict(kept)}, ops.indices)
            units = (torch.tensor([offset], dtype=torch.float64), torch.tensor([scale], dtype=torch.float64))
            return handle(self.strategy.client_view(), ops, task, units, self.transform)

        return self._answer_here(kind, -1, client.id, X, full_cov, answer)

    def _answer_here(
        self, kind: str, known: int, who: Any, X, full_cov: bool, answer
    ) -> dict[str, torch.Tensor]:
        """A ``kind`` task for the client ``who`` (training position ``known``, -1 if never seen)
        answered in this process by ``answer(task)``, checked against its declared reply as an
        engine checks a client's."""
        task, fields = personal_task(self, kind, torch.tensor([known]), X, full_cov)
        try:
            reply = Record(answer(task))
            (reason,) = check_reply(reply, fields, 1)
        except Exception as err:  # noqa: BLE001 - as an engine reports a client's failure
            reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:500]
        if reason is not None:
            raise EngineError(f"client {who!r} could not {kind}: {reason}")
        return {name: value[0] for name, value in reply.tensors.items()}

    # -- an owner that added rows after fit ---------------------------------------------------------
    def update(self, client: int | ClientData | Any, X_new: Any, y_new: Any) -> None:
        """Add rows ``(X_new, y_new)`` to the training owner ``client`` (a position, an id or its
        ``ClientData``): from now on its posterior conditions on all its rows.

        The shared hyper-parameters and the owner's choice of state stay as fitted; its posterior's
        Cholesky factor grows by the new rows' block, O(n²k) instead of factorising n + k rows again,
        and equals that refit to rounding. The data transforms stay as the run learned them: the
        federation's outcome standardisation and input box are every owner's units and the learned
        state's, so one owner's rows cannot move them (an owner standardising with its own mean and sd,
        ``Standardize(local=True)``, re-derives its own from all its rows). ``X_new``: ``(k, d)``, a
        ``DataFrame``'s named columns matched to :attr:`feature_names`; ``y_new``: ``(k,)``.

        The rows stay with the result: :attr:`federation` holds the owner's grown ``ClientData``
        (a ``ClientData`` object given before is now a new client with the rows it holds), and
        ``posterior``, ``predict``, ``ask``, ``evaluate``, ``combine=`` and the exports condition on
        them. To train on them too, continue with ``fedgp.fit(result.warm_spec(), result.federation,
        ...)``. Refused, naming the owner: a loaded result, an owner of the Ray or Flower engine
        (its rows are on its own machine), a variational spec, known per-point noise, new rows
        wrong in width, names or values (:mod:`fedgp.run.streaming`)."""
        position, owner = grow(self, client, X_new, y_new)
        self._grown[position] = owner
        self.federation = self.federation.with_client(position, owner.data)

    def warm_spec(self) -> GPSpec:
        """The spec with the learned state as its initial values, to continue training from it
        (``fedgp.fit(result.warm_spec(), result.federation, ...)``, after :meth:`update`s say). The
        state is in the run's units; a continuing run learns its transforms again from its data."""
        return warm_spec(self.spec, self.state)

    def _ask_grown(self, kind: str, position: int, X, full_cov: bool) -> dict[str, torch.Tensor]:
        """A ``kind`` task answered for an owner that added rows, from its grown factor, by the task
        kind's own reply code (so in the same fields and units as an engine's answer)."""
        owner = self._grown[position] = current_owner(self, position)

        def answer(task: Task) -> dict[str, torch.Tensor]:
            ops = owner.ops(self.spec, self.transform)
            offset = torch.tensor([owner.offset], dtype=torch.float64)
            scale = torch.tensor([owner.scale], dtype=torch.float64)
            return KINDS[kind].answer_under(
                owner.states, owner.cluster, ops, task, offset, scale, self.transform
            )

        return self._answer_here(kind, position, self.roster.ids[position], X, full_cov, answer)

    def client_state(self, client: int | ClientData | Any) -> HyperState:
        """The state a client conditions on (FGPR: the global state; clustered: its cluster's)."""
        reply = self._answer("personal", self._position(client), None, False)
        return read_state({k: v.unsqueeze(0) for k, v in reply.items()}, self.spec, "state/").index(0)

    def posterior(
        self,
        X: Any,
        client: int | ClientData | Any = None,
        full_cov: bool = False,
        combine: str | None = None,
    ) -> Prediction:
        """Predictive distribution at ``X`` for ``client`` (an index, an id, or a new ``ClientData``),
        conditioning its personal state on that client's training data only. ``full_cov`` adds the
        joint covariance of f at ``X`` (for ``Prediction.sample`` and ``to_distribution``).

        ``combine`` (with no ``client``): one global prediction, for points no client owns, from every
        training client's own posterior at ``X`` — ``"rbcm"``, ``"bcm"``, ``"gpoe"`` or ``"poe"``
        (Deisenroth & Ng 2015; :mod:`fedgp.models.experts`). Only the clients' predictive means and
        variances at ``X`` leave them (:mod:`fedgp.run.combined`).

        ``X``: an (n, d) array, tensor or ``DataFrame``. Where the model recorded feature names
        (:attr:`feature_names`), a ``DataFrame`` with string column names is matched to them by name
        (reordered; a missing or extra column is refused, naming it) and an unnamed array is read in
        the recorded order; where it recorded none, a ``DataFrame`` is read by position. A new
        ``ClientData`` with feature names is put in the model's order the same way."""
        if (client is None) == (combine is None):
            raise InputError(
                "posterior/predict: pass client=... (that client's personalised prediction) or "
                "combine='rbcm' (or 'bcm', 'gpoe', 'poe': one prediction combined from every client's), "
                f"not {'both' if combine is not None else 'neither'}"
            )
        if combine is not None and full_cov:
            raise InputError("full_cov=True is per client: a combined prediction has marginal variances only")
        if combine is not None:
            check_experts(self)
        where = self._position(client if client is not None else 0)  # resolved once
        d = self._dims(where)
        name = client.id if isinstance(client, ClientData) else client
        if combine is not None:
            name = "(combined prediction)"
        # Named columns in the model's order; then a copy (pandas and read-only arrays included),
        # checked for dtype and NaN/inf as data are.
        names = self.feature_names
        training = not isinstance(where, ClientData) and self.federation is not None
        if isinstance(self.spec, OwnFeaturesSpec) and training:
            own = self.federation[where]  # asked only here: a plain predict stays on its short path
            if isinstance(own, OwnerData):  # its own columns follow the core
                names, d = (*names, *own.own_names), d + own.n_own
        if names is not None:  # else X is read by position, as it is
            X = align(X, names, _where(name))
        X = _as_float_tensor(X, name, "X")
        if X.dim() != 2 or X.shape[1] != d:
            whose = f"client {name!r}, whose model takes" if client is not None else "the model, which takes"
            raise InputError(
                f"X must have shape (n, {d}) for {whose} {d} input features; "
                f"got {tuple(X.shape)}" + ("; for one feature use X[:, None]" if X.dim() == 1 else "")
            )
        _check_finite(X, name, "X")
        if combine is not None:
            return combined_posterior(self, X, combine)
        if self._here(where):
            return self._predict_here(where, X, full_cov)
        reply = self._answer("predict", where, X, full_cov)
        return Prediction(
            reply["mean"],
            reply["variance_f"],
            reply["variance_y"],
            reply.get("covariance_f"),
            reply.get("mean_f"),
        )

    def _dims(self, where: int | ClientData) -> int:
        """The input width of the model of the client at training position ``where``, or of a new
        client's (its columns already in the model's order), which must match the training data's."""
        if isinstance(where, ClientData):
            client = where
            trained = int(self.roster.dims[0]) if len(self.roster.dims) else client.n_features
            if client.n_features != trained:
                raise InputError(
                    f"client {client.id!r} has {client.n_features} features, but the model was "
                    f"trained on {trained}-feature data: give the new client's X the same {trained} "
                    "input columns, in the same order, as the training clients"
                )
            return client.n_features
        return int(self.roster.dims[where])

    def predict(
        self,
        X: Any,
        client: int | ClientData | Any = None,
        observation_noise: bool = False,
        combine: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, variance)`` at ``X`` for ``client``, or combined from every client's with ``combine``
        (see :meth:`posterior`); variance of f, or of y with observation_noise."""
        pred = self.posterior(X, client, combine=combine)
        return pred.mean, pred.variance(observation_noise)

    def evaluate(self) -> pd.DataFrame:
        """Per-client test RMSE, NLL, 95% coverage and cluster (clients with a test split): columns
        ``client, n_test, rmse, nll, coverage95, cluster``. When no client has a test split the frame
        is empty, and a client that could not answer is left out (``attrs["failures"]`` says why):
        both with a :class:`~fedgp.errors.FallbackWarning`, since an empty or short table is easily
        read as a result. The clients score their own data, whose columns are the model's."""
        if self.engine is None:
            raise InputError(
                "a loaded result holds no client data to evaluate; predict per ClientData instead"
            )
        frame = evaluate_clients(self)
        if not bool((self.roster.n_test > 0).any()):
            warnings.warn(
                f"evaluate: none of the {len(self.roster.ids)} clients holds a test split, so there is "
                "nothing to evaluate and the table is empty. Hold out test rows before fitting: "
                "fed.split(0.25, seed=0) in Python (fedgp fit --test-fraction 0.25; the Flower app's "
                "test-fraction); for in-sample figures, result.posterior(client.X, client).rmse(client.y)",
                FallbackWarning,
                stacklevel=2,
            )
        elif frame.attrs.get("failures"):
            warnings.warn(
                f"evaluate: left out the clients that could not evaluate: {frame.attrs['failures']}",
                FallbackWarning,
                stacklevel=2,
            )
        return frame

    def plot(self, axes: Sequence[Axes] | None = None, figsize: tuple[float, float] | None = None) -> Figure:
        """The history against the rounds, one panel each: train NLL; the clients' mean test RMSE and
        test NLL (± their spread) when clients held test rows; the hyper-parameters (a clustered
        strategy's per cluster, ``j/name``). Returns the matplotlib ``Figure``.

        It draws on a bare ``Figure`` that pyplot does not manage, and never calls ``plt.show()``: so
        it opens no window and blocks nothing, works on a headless machine and in threads with any
        backend, is freed when you drop it, and a notebook shows the returned figure once. Save it with
        ``fig.savefig("history.png")``. ``axes`` (one per panel, such as another run's
        ``fig.axes`` to overlay two runs, or ``plt.subplots(n)[1]`` to draw in a pyplot figure) or
        ``figsize`` otherwise. See :func:`fedgp.plotting.plot_history`."""
        history = self.history
        parameters = list(self.strategy.describe(self.server_state)) if len(history) else []
        return plot_history(history, [c for c in parameters if c in history], axes=axes, figsize=figsize)

    # -- leaving the session ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, key: bytes | str | None = None) -> Path:
        """Write spec, strategy, server state, transforms and history (no client data) to one file;
        :func:`fedgp.load` reads it back without pickle. See :mod:`fedgp.run.saved`. ``key`` (bytes or
        a string) seals the file with an HMAC-SHA256 under it, so that only a holder of the key can
        write a file that loads: without one, the file's SHA-256 detects damage, not forgery.

        With personal hyper-parameters (``FGPR(personal=...)``) the file holds every owner's own
        values too, keyed by its id (:meth:`personal_values`, :mod:`fedgp.run.kept`): the loaded
        model predicts for a ``ClientData`` with an owner's id under that owner's values, as the fitted
        one does, and for any other id under the initial ones. That is a simulation's file, where one
        process plays every owner. In a deployment each node keeps its own values and the server has
        none, so saving is refused there (a file of the shared values alone would predict every owner
        under the initial ones). An :class:`~fedgp.models.own_features.OwnFeaturesSpec` is refused: the
        file describes the shared spec only, not the owners' own kernels."""
        if isinstance(self.spec, OwnFeaturesSpec):
            raise InputError(
                "save: an OwnFeaturesSpec result cannot be saved yet: the file describes a GPSpec or "
                "MultiOutputSpec, not the owners' own kernels on their own columns (own_module.*); "
                "predict with the fitted result (result.predict(X, client=...))"
            )
        if self.strategy.keeps_client_memory:
            try:
                self.personal_values()
            except InputError as err:
                raise InputError(f"save: {err}") from None
        return write_result(self, path, key)

    def personal_values(self) -> dict[Any, dict[str, torch.Tensor]]:
        """Each owner's personal hyper-parameters (``FGPR(personal=...)``) by client id:
        ``{id: {state name: float64 tensor}}``, in the units of :attr:`state`, for the owners that keep
        any (those that trained); ``{}`` when the strategy has none. Under ``FGPR(shrink=...)`` a shrunk
        name is shared and the owner keeps its offset ``offset/<name>`` instead, in raw (unconstrained)
        units (:mod:`fedgp.strategies.shrinkage`): the owner's value itself is :meth:`client_state`'s.
        In a simulation one process plays
        every owner, so you hold them all: a fitted result reads them from its engine
        (:meth:`fedgp.engines.Engine.read_client_memory`), a loaded one from its file. In a deployment
        each node keeps its own and the server holds none: :class:`~fedgp.errors.InputError`."""
        if self.engine is None or not self.strategy.keeps_client_memory:
            return {owner: dict(values) for owner, values in self.owner_values.items()}
        try:
            return self.engine.read_client_memory()
        except EngineError as err:
            raise InputError(
                f"the owners keep their personal hyper-parameters ({', '.join(sorted(self._personal))}) "
                f"with them: {err}. A file of the shared values alone would predict every owner under "
                "the initial ones; predict on the deployment, where each owner conditions on its own"
            ) from None

    @property
    def _personal(self) -> frozenset[str]:
        """What each owner keeps for itself: its personal state names and, under shrinkage, the offsets
        of the shrunk ones (``offset/<name>``), whose personal names are shared values."""
        return self.strategy.kept_names(self.spec)

    @classmethod
    def load(cls, path: str | os.PathLike, *, key: bytes | str | None = None) -> FitResult:
        """The result :meth:`save` wrote (``fedgp.load``): it predicts for any ``ClientData``. ``key``:
        the key it was saved with (a file saved with a key is refused without it, or with another)."""
        parts = read_result(path, key)
        try:
            result = cls(**parts)
            state = result.state  # what prediction conditions on: refused here, not at predict
            if not isinstance(state, HyperState) or sorted(state) != sorted(result.spec.names):
                names = sorted(result.spec.names)
                raise FileFormatError(f"{path}: server_state does not hold the spec's parameters {names}")
            return result
        except FileFormatError:
            raise
        except Exception as err:  # noqa: BLE001 - every part passed its checks; refuse, naming the file
            raise FileFormatError(
                f"{path}: its parts do not make a fit result ({type(err).__name__}: {err})"
            ) from None

    def client_data(self, client: int | ClientData | Any) -> ClientData:
        """The ``ClientData`` behind ``client`` (a new ``ClientData`` as it is, its columns put in the
        model's order by name)."""
        if isinstance(client, ClientData):
            members = () if self.federation is None else self.federation
            return client if any(m is client for m in members) else client.in_order(self.feature_names)
        return self.federation[self._position(client)]

    def to_gpytorch(self, client: int | ClientData | Any) -> ExactGPModel:
        """``client``'s model as a GPyTorch ``ExactGP`` in eval mode, conditioned on its data."""
        return to_gpytorch(self, client)

    def to_botorch(self, client: int | ClientData | Any, trainable: bool = False) -> SingleTaskGP:
        """``client``'s model as a BoTorch ``SingleTaskGP`` with the learned hyper-parameters fixed,
        or with ``trainable=True`` free for ``fit_gpytorch_mll`` to fine-tune from them (needs the
        ``botorch`` extra)."""
        return to_botorch(self, client, trainable)


def _where(name) -> str:
    """Who a prediction is for, in an error message."""
    return name if name == "(combined prediction)" else f"predict for client {name!r}"


def _some(ids, k: int = 5) -> str:
    """The first ``k`` ids, for an error message."""
    return ", ".join(map(repr, ids[:k])) + (", ..." if len(ids) > k else "")
