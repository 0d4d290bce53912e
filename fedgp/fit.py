"""``fedgp.fit``: spec + federation + strategy + engine -> a result that predicts per client.

The round loop lives here, once, for every engine, and never runs client code::

    registry = engine.start(strategy, seed)                  # hello: ids and sizes
    for each round:
        plan = strategy.configure(...)                       # who, what, which replies
        exchange = rounds.exchange(engine, "train", ...)     # messages out, replies and failures back
        server, metrics = strategy.aggregate(..., exchange.replies, ...)

Evaluation, prediction and a client's personal state are exchanges too: the client computes them
on its own data and only the results travel.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedgp.attacks.base import Attack
from fedgp.data.client import ClientData, Federation, _as_float_tensor, _check_finite, check_trainable
from fedgp.engines.base import Engine, Registry
from fedgp.engines.batched import BatchedEngine
from fedgp.engines.checkpoint import (
    Checkpoint,
    CheckpointError,
    fingerprint_mismatches,
    load_checkpoint,
    save_checkpoint,
)
from fedgp.engines.client import reply_fields
from fedgp.engines.fingerprint import run_fingerprint
from fedgp.engines.sequential import SequentialEngine
from fedgp.messages import Record, read_state
from fedgp.models.posterior import Prediction
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.progress import progress_bar
from fedgp.rng import generator
from fedgp.rounds import RoundFailedError, exchange
from fedgp.stopping import ConvergenceWarning, StopRule, resolve_stop, state_rows
from fedgp.strategies.base import RoundPlan, ServerContext, Strategy
from fedgp.strategies.fgpr import FGPR
from fedgp.transforms import (
    DataTransform,
    Normalize,
    Standardize,
    auto_reason,
    learn,
    resolve_transforms,
    summary_fields,
)

__all__ = [
    "fit",
    "FitResult",
    "make_engine",
    "engine_options",
    "server_context",
    "ENGINES",
    "RoundFailedError",
    "UnknownClientError",
]

#: Engines by name for ``fit(engine=...)``; ``ray`` and ``flower`` need their extras (``EXTRA_ENGINES``).
ENGINES: dict[str, Any] = {"sequential": SequentialEngine, "batched": BatchedEngine}
#: Engines whose dependencies are optional extras, imported when first asked for.
EXTRA_ENGINES = {"ray": "fedgp.engines.ray:RayEngine", "flower": "fedgp.flower.local:FlowerEngine"}


#: Options the sequential engine takes (``"auto"`` keeps the batched engine for any other).
_SEQUENTIAL_OPTIONS = {"loopback", "timeout", "keys"}
#: Engines that pass their other options on to another engine (Ray: to each shard's batched engine).
FORWARDS_OPTIONS = {"ray": BatchedEngine}


class UnknownClientError(ValueError, KeyError):
    """A client the result does not know: a ``ValueError`` (and, for old callers, a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def engine_options(cls: type | Callable) -> list[str]:
    """The ``engine_options`` keys engine class ``cls`` accepts: the keyword arguments of its
    ``__init__`` and of the base ``__init__`` it passes ``**options`` on to (or of a factory)."""
    names: list[str] = []
    inits = (
        [vars(k)["__init__"] for k in cls.__mro__ if "__init__" in vars(k)]
        if isinstance(cls, type)
        else [cls]
    )
    for init in inits:
        if init is object.__init__:
            break
        params = inspect.signature(init).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names += [
            p.name for p in params if p.kind in kinds and p.name not in ("self", "spec", "clients", "seed")
        ]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return list(dict.fromkeys(names))


def make_engine(name: str, spec: GPSpec, federation: Federation, seed: int = 0, **options) -> Engine:
    """The engine called ``name``. ``"auto"``: the batched engine where its tensor path reproduces
    GPyTorch for ``spec`` (it checks itself at construction), else the sequential engine (the same
    numbers; a batched engine would evaluate client by client anyway), unless batched-only options
    were given."""
    if name == "auto":
        _check_engine_options("auto", BatchedEngine, options)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "the batched engine evaluates this spec", UserWarning)
            batched = BatchedEngine(spec, federation, seed, **options)
        if batched.gp is None and set(options) <= _SEQUENTIAL_OPTIONS:
            return SequentialEngine(spec, federation, seed, **options)
        return batched
    if name in ENGINES:
        cls = ENGINES[name]
    elif name in EXTRA_ENGINES:
        module, _, attr = EXTRA_ENGINES[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)
    else:
        known = ", ".join(["auto", *ENGINES, *EXTRA_ENGINES])
        raise ValueError(f"unknown engine {name!r}; available: {known}") from None
    _check_engine_options(name, cls, options)
    return cls(spec, federation, seed, **options)


def _check_engine_options(name: str, cls, options: dict) -> None:
    valid = engine_options(cls) + (engine_options(FORWARDS_OPTIONS[name]) if name in FORWARDS_OPTIONS else [])
    unknown = [key for key in options if key not in valid]
    if unknown:
        raise ValueError(
            f"engine_options: unknown key(s) {', '.join(map(repr, unknown))} for engine {name!r}; "
            f"valid keys: {', '.join(dict.fromkeys(valid))}"
        )


def server_context(spec: GPSpec, registry: Registry, seed: int) -> ServerContext:
    """What the server knows after registration: sizes, weights p_k = n_k / N, ids, seed."""
    sizes = registry.sizes.to(torch.long)
    return ServerContext(spec, sizes, sizes.to(torch.float64) / sizes.sum(), registry.ids, seed)


def _num_clusters(strategy: Strategy, server: Any) -> int:
    state = strategy.global_state(server)
    return int(state.batch_shape[0]) if state.batch_shape else 1


def _personal_exchange(
    strategy,
    server,
    ctx,
    engine,
    registry,
    kind,
    positions,
    known,
    transform,
    shared=None,
    points=0,
    full_cov=False,
):
    """A ``kind`` task (evaluate / predict / personal) to the clients at ``positions`` of ``engine``;
    ``known`` are their positions in the training registry (-1 for clients it never saw)."""
    shared_rec, personal = strategy.configure_personal(server, ctx, known)
    if shared or full_cov:
        settings = {**shared_rec.settings, **({"full_cov": True} if full_cov else {})}
        shared_rec = Record({**shared_rec.tensors, **(shared or {})}, settings)
    fields = reply_fields(kind, ctx.spec, _num_clusters(strategy, server), points, full_cov)
    plan = RoundPlan(positions, torch.ones(len(positions), dtype=torch.float64), shared_rec, personal, fields)
    return exchange(engine, kind, 0, plan, registry.ids, min_replies=1, transform=transform)


def learn_transform(
    engine: Engine,
    registry: Registry,
    outcome: Standardize | str | None,
    inputs: Normalize | str | None,
    spec: GPSpec | None = None,
) -> DataTransform:
    """The data transforms of a run: a ``summarise`` exchange with every client when they need the
    federation's statistics (:mod:`fedgp.transforms`), then the server's arithmetic."""
    reason = auto_reason(spec) if "auto" in (outcome, inputs) else None
    note = f"'auto' transforms nothing: {reason}" if reason else ""
    outcome, inputs = resolve_transforms(spec, outcome, inputs)
    d = int(registry.dims[0])
    with_bounds = inputs is not None and inputs.bounds is None
    if not (with_bounds or (outcome is not None and not outcome.local)):
        return replace(learn(outcome, inputs, None, None, d), note=note)
    everyone = torch.arange(len(registry.ids))

    def ask(stage: str, settings: dict):
        fields = summary_fields(d, stage, with_bounds)
        plan = RoundPlan(
            everyone, torch.ones(len(everyone)), Record({}, {"stage": stage, **settings}), Record(), fields
        )
        # Every client must answer: the transform is the whole federation's.
        return exchange(engine, "summarise", 0, plan, registry.ids, min_replies=len(everyone)).replies

    first = ask("mean", {"bounds": with_bounds})
    sums = dict(first.sums)
    if outcome is not None and not outcome.local:
        center = float(sums["y_sum"]) / float(sums["count"])
        sums.update(ask("spread", {"center": center}).sums)
    return replace(learn(outcome, inputs, sums, first.individual, d), note=note)


def evaluate_clients(strategy, server, ctx, engine, registry, transform=None) -> pd.DataFrame:
    """Per-client test metrics in the original units, computed by each client on its own test split."""
    positions = torch.nonzero(registry.n_test > 0).flatten()
    columns = ["client", "n_test", "rmse", "nll", "coverage95", "cluster"]
    if not len(positions):
        return pd.DataFrame(columns=columns)
    replies = _personal_exchange(
        strategy, server, ctx, engine, registry, "evaluate", positions, positions, transform
    ).replies
    frame = pd.DataFrame({name: replies[name].tolist() for name in columns[1:]})
    frame.insert(0, "client", [registry.ids[p] for p in replies.participants.tolist()])
    failed = {registry.ids[p]: r for p, r in replies.failures.items()}
    frame.attrs["failures"] = failed
    return frame


def _summarise(per_client: pd.DataFrame) -> dict[str, float]:
    return {
        "test_rmse_mean": float(per_client["rmse"].mean()),
        "test_rmse_std": float(per_client["rmse"].std(ddof=0)),
        "test_nll_mean": float(per_client["nll"].mean()),
        "test_nll_std": float(per_client["nll"].std(ddof=0)),
    }


@dataclass
class FitResult:
    """The outcome of :func:`fit`: learned server state, history, and per-client prediction.

    ``history`` has one row per round (metrics, the round's failures and bytes); ``failures`` one
    row per failed client and round, with the reason.
    """

    spec: GPSpec
    strategy: Strategy
    federation: Federation | None
    server_state: Any
    history: pd.DataFrame
    seed: int
    engine: Engine | None  # None for a result read back by fedgp.load
    registry: Registry | None = None
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    attackers: list = field(default_factory=list)  # ids of the clients an ``attack`` took over
    transform: DataTransform = field(default_factory=DataTransform)  # applied to every client's data

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
        it."""
        return server_context(self.spec, self.registry, self.seed)

    def _resolve(self, client: int | ClientData | Any) -> tuple[Engine, Registry, int, int]:
        """(engine hosting the client, its registry, its position there, its training position or -1).

        An int is a position, a ``ClientData`` of the federation that client, any other
        ``ClientData`` a new client (hosted alone, as the server has never seen it), else an id."""
        if isinstance(client, ClientData):
            members = [] if self.federation is None else list(self.federation)
            for i, member in enumerate(members):
                if member is client:
                    return self.engine, self.registry, i, i
            engine = SequentialEngine(self.spec, [client], self.seed)
            return engine, engine.start(self.strategy, self.seed), 0, -1
        if self.engine is None:
            raise ValueError(
                f"client {client!r}: this result was loaded from a file and holds no client data; "
                "pass the client's ClientData instead"
            )
        ids = self.registry.ids
        if isinstance(client, (int, np.integer)) and not isinstance(client, bool):
            position = int(client)
            if not 0 <= position < len(ids):
                raise UnknownClientError(
                    f"client={position}: no client at that position; the model was trained on "
                    f"{len(ids)} clients, positions 0..{len(ids) - 1} (ids {_some(ids)}). Pass a position, "
                    "an id, or a fedgp.data.ClientData to predict for a new client"
                )
            return self.engine, self.registry, position, position
        try:
            position = self.registry.position(client)
        except KeyError:
            raise UnknownClientError(
                f"client={client!r}: no client with id {client!r} among the {len(ids)} trained on "
                f"(ids {_some(ids)}). Pass a position, an id, or a fedgp.data.ClientData to predict for "
                "a new client"
            ) from None
        return self.engine, self.registry, position, position

    def _ask(self, kind: str, client, shared: dict | None = None, points: int = 0, full_cov: bool = False):
        engine, registry, position, known = self._resolve(client)
        ctx = self.context
        try:
            replies = _personal_exchange(
                self.strategy,
                self.server_state,
                ctx,
                engine,
                registry,
                kind,
                torch.tensor([position]),
                torch.tensor([known]),
                self.transform,
                shared,
                points,
                full_cov,
            ).replies
        except RoundFailedError as err:
            (reason,) = err.failures.values()
            raise RuntimeError(f"client {registry.ids[position]!r} could not {kind}: {reason}") from None
        return replies

    def client_state(self, client: int | ClientData | Any) -> HyperState:
        """The state a client conditions on (FGPR: the global state; clustered: its cluster's)."""
        replies = self._ask("personal", client)
        return read_state(replies.individual, self.spec, "state/").index(0)

    def posterior(self, X: Any, client: int | ClientData | Any, full_cov: bool = False) -> Prediction:
        """Predictive distribution at ``X`` for ``client`` (an index, an id, or a new ``ClientData``),
        conditioning its personal state on that client's training data only. ``full_cov`` adds the
        joint covariance of f at ``X`` (for ``Prediction.sample`` and ``to_distribution``)."""
        d = self._dims(client)
        name = client.id if isinstance(client, ClientData) else client
        # A copy (pandas and read-only arrays included), checked for dtype and NaN/inf as data are.
        X = _as_float_tensor(X, name, "X")
        if X.dim() != 2 or X.shape[1] != d:
            raise ValueError(
                f"X must have shape (n, {d}) for client {name!r}, whose model takes {d} input features; "
                f"got {tuple(X.shape)}" + ("; for one feature use X[:, None]" if X.dim() == 1 else "")
            )
        _check_finite(X, name, "X")
        replies = self._ask("predict", client, {"X": X}, X.shape[0], full_cov)
        covariance = replies["covariance_f"][0] if full_cov else None
        return Prediction(replies["mean"][0], replies["variance_f"][0], replies["variance_y"][0], covariance)

    def _dims(self, client) -> int:
        """The input width of ``client``'s model; a new client must match the training data's."""
        if isinstance(client, ClientData):
            trained = int(self.registry.dims[0]) if len(self.registry.dims) else client.n_features
            if client.n_features != trained:
                raise ValueError(
                    f"client {client.id!r} has {client.n_features} features, but the model was "
                    f"trained on {trained}-feature data: give the new client's X the same {trained} "
                    "input columns, in the same order, as the training clients"
                )
            return client.n_features
        return int(self.registry.dims[self._resolve(client)[2]])

    def predict(
        self, X: Any, client: int | ClientData | Any, observation_noise: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, variance)`` at ``X`` for ``client``; variance of f, or of y with observation_noise."""
        pred = self.posterior(X, client)
        return pred.mean, pred.variance(observation_noise)

    def evaluate(self) -> pd.DataFrame:
        """Per-client test RMSE, NLL, 95% coverage and cluster (clients with a test split): columns
        ``client, n_test, rmse, nll, coverage95, cluster``, also when no client has a test split
        (then the frame is empty)."""
        if self.engine is None:
            raise ValueError(
                "a loaded result holds no client data to evaluate; predict per ClientData instead"
            )
        return evaluate_clients(
            self.strategy, self.server_state, self.context, self.engine, self.registry, self.transform
        )

    # -- leaving the session ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write spec, strategy, server state and history (no client data) to one safetensors file;
        :func:`fedgp.load` reads it back without pickle. See :mod:`fedgp.export.saved`."""
        from fedgp.export.saved import save_result

        return save_result(self, path)

    def client_data(self, client: int | ClientData | Any) -> ClientData:
        """The ``ClientData`` behind ``client`` (a new ``ClientData`` is returned as it is)."""
        if isinstance(client, ClientData):
            return client
        _, _, position, _ = self._resolve(client)
        return self.federation[position]

    def to_gpytorch(self, client: int | ClientData | Any):
        """``client``'s model as a GPyTorch ``ExactGP`` in eval mode, conditioned on its data."""
        from fedgp.export.exact_gp import to_gpytorch

        return to_gpytorch(self, client)

    def to_botorch(self, client: int | ClientData | Any):
        """``client``'s model as a BoTorch ``SingleTaskGP`` with the learned hyper-parameters fixed
        (needs the ``botorch`` extra)."""
        from fedgp.export.botorch_model import to_botorch

        return to_botorch(self, client)


def _some(ids, k: int = 5) -> str:
    """The first ``k`` ids, for an error message."""
    return ", ".join(map(repr, ids[:k])) + (", ..." if len(ids) > k else "")


def _failure_summary(failures: dict, ids) -> str:
    return " | ".join(f"{ids[p]!r}: {reason}" for p, reason in failures.items())


def _report_stop(frame: pd.DataFrame, rule: StopRule, reason: str | None, done: int) -> None:
    """Record why the run ended; warn when it spent its budget without meeting ``rule``."""
    frame.attrs["stopped"] = reason is not None
    if reason is not None:
        frame.attrs["stop_reason"] = f"round {done}: {reason}"
        return
    frame.attrs["stop_reason"] = f"round budget: all {done} rounds ran without meeting {rule!r}"
    no_nll = rule.uses_nll and not any(
        math.isfinite(v) for v in frame.get("train_nll", pd.Series(dtype=float)).astype(float)
    )
    hint = " (this strategy reports no train_nll, so NLLPlateau cannot hold)" if no_nll else ""
    warnings.warn(
        f"fit did not converge: the {done}-round budget ended before the stopping rule {rule!r} "
        f"held{hint}. Raise rounds (or resume from a checkpoint with more rounds), raise the "
        "strategy's lr or local_steps, or loosen the rule; result.history shows the last rounds",
        ConvergenceWarning,
        stacklevel=3,
    )


def fit(
    spec: GPSpec,
    federation: Federation | None,
    strategy: Strategy | None = None,
    rounds: int = 100,
    engine: str | Engine = "auto",
    seed: int = 0,
    *,
    progress: bool | None = None,
    eval_every: int | None = None,
    checkpoint_every: int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume_from: str | os.PathLike | None = None,
    engine_options: dict | None = None,
    device: str | torch.device | None = None,
    callback: Callable[[int, Any], None] | None = None,
    min_replies: int | float = 1,
    simulate_failures: float = 0.0,
    attack: Attack | None = None,
    outcome_transform: Standardize | str | None = "auto",
    input_transform: Normalize | str | None = "auto",
    stop: StopRule | str | None = None,
) -> FitResult:
    """Train ``strategy`` (default :class:`~fedgp.strategies.FGPR`) on ``federation``.

    Args:
        rounds: communication rounds R (total, including rounds restored from a checkpoint); with a
            ``stop`` rule, the budget.
        engine: ``"auto"`` (default: ``"batched"`` where its tensor path applies to the spec, else
            ``"sequential"``), ``"sequential"`` (the reference, one GPyTorch model per client) or
            ``"batched"`` (all clients' steps as one tensor program; the same results to rounding,
            much faster for many clients), ``"ray"``, ``"flower"``, with ``engine_options``; or an
            :class:`~fedgp.engines.base.Engine` instance (then ``federation`` may be ``None``).
        seed: master seed; every random draw derives from it, per round and client.
        progress: ``None`` (default): a tqdm bar over rounds on a terminal, nothing otherwise;
            ``True``: the bar on a terminal, else a line on stderr every tenth of the rounds (for
            logs); ``False``: nothing (:mod:`fedgp.progress`).
        eval_every: every how many rounds the clients report test metrics (default 1 if some have
            test splits, else never). Each evaluation conditions every client on its own data.
        device: run the batched engine's tensor path there (e.g. ``"cuda"``); the same as
            ``engine_options={"device": ...}``, and with ``engine="auto"`` it selects the batched engine.
        checkpoint_every / checkpoint_path: save a checkpoint every N rounds (and at the end).
        resume_from: continue from a checkpoint; the result is bit-identical to an unbroken run.
        callback: called as ``callback(round, server_state)`` after every round (1-based round).
        min_replies: the fewest clients that must reply for a round to count: a count (int) or a
            fraction of the round's participants (float). Below it ``fit`` raises
            :class:`RoundFailedError` naming the clients that failed and why. A failed client is
            dropped from its round (weights renormalised over the replies) and asked again next round.
        simulate_failures: each participating client fails its local update with this probability
            per round (drawn from (seed, round, client), so the same clients fail on every engine).
        attack: a :class:`fedgp.attacks.Attack`; its clients (drawn from ``seed`` or given by id,
            listed in ``FitResult.attackers``) forge their training replies or train on flipped
            labels, the same way on every engine.
        outcome_transform: :class:`~fedgp.transforms.Standardize` (the federation's mean and sd,
            from summed counts and sums), ``Standardize(local=True)`` (each client's own), or
            ``None``. Predictions, variances and metrics always come back in the original units.
        input_transform: :class:`~fedgp.transforms.Normalize` (the unit cube from the federation's
            min/max, or ``Normalize(bounds=...)``), or ``None``. ``"auto"`` (both defaults):
            ``Standardize()`` and ``Normalize()``, except when the spec fixes a hyper-parameter (its
            value is in the data's units) or its mean is linear without a bias (regression through
            the origin, which a shift would change): then none, and the history says why. The
            hyper-parameters (``result.state``) are in the transformed units; ``result.transforms``
            says what was applied.
        stop: a stopping rule (:mod:`fedgp.stopping`: ``StateChange(tol, window)``,
            ``NLLPlateau(patience, min_delta)``, ``AnyOf(...)``), ``"auto"`` (either of the two with
            their defaults), or ``None`` (default: every one of ``rounds`` rounds, as in the
            papers' protocols). With a rule the run ends at the first round where it holds;
            ``history.attrs["stop_reason"]`` says why the run ended and ``history.attrs["stopped"]``
            whether the rule was met; a run that ends at the round budget first raises a
            :class:`~fedgp.stopping.ConvergenceWarning`.
    """
    if not isinstance(spec, GPSpec):
        raise TypeError(
            f"spec must be a fedgp.GPSpec (the model: mean, kernel, likelihood), got "
            f"{type(spec).__name__}; e.g. fedgp.GPSpec(kernel=gpytorch.kernels.RBFKernel())"
        )
    strategy = FGPR() if strategy is None else strategy
    if not isinstance(strategy, Strategy):
        raise TypeError(
            f"strategy must be a fedgp.strategies.Strategy (e.g. fedgp.strategies.FGPR()), "
            f"got {type(strategy).__name__}"
        )
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    rule = resolve_stop(stop)
    if checkpoint_every is not None and checkpoint_path is None:
        raise ValueError("checkpoint_every needs checkpoint_path")
    if not (isinstance(simulate_failures, (int, float)) and 0.0 <= simulate_failures < 1.0):
        raise ValueError(f"simulate_failures must be a probability in [0, 1), got {simulate_failures!r}")
    if device is not None:
        if isinstance(engine, Engine) or engine not in ("auto", "batched"):
            raise ValueError(
                f"device={device!r} applies to engine='batched' or 'auto', not {engine!r}; "
                "an engine instance takes its own device option"
            )
        engine_options = {**(engine_options or {}), "device": device}
    if isinstance(engine, Engine):
        if engine_options:
            raise ValueError("engine_options apply to an engine given by name, not to an instance")
        runner = engine
        if federation is None and getattr(engine, "clients", None):
            federation = Federation(list(engine.clients))
    else:
        if not isinstance(federation, Federation):
            raise TypeError(f"federation must be a fedgp.data.Federation, got {type(federation).__name__}")
        runner = make_engine(engine, spec, federation, seed, **(engine_options or {}))
    registry = runner.start(strategy, seed)
    for client_id, n in zip(registry.ids, registry.sizes.tolist()):  # remote clients too (Flower)
        check_trainable(client_id, n)
    transform = learn_transform(runner, registry, outcome_transform, input_transform, spec)
    ctx = server_context(spec, registry, seed)
    if eval_every is None:
        eval_every = 1 if bool((registry.n_test > 0).any()) else 0
    options = {"simulate_failures": float(simulate_failures)} if simulate_failures else {}
    bound = None if attack is None else attack.bind(strategy, spec, registry.ids, seed)
    if bound is not None:
        options.update(bound.options)

    fingerprint: dict[str, str] = {}
    if checkpoint_every or resume_from is not None:  # it hashes all data: only when it is needed
        fit_options = {
            "eval_every": eval_every,
            "min_replies": min_replies,
            "simulate_failures": float(simulate_failures),
            "attack": None if bound is None else (repr(attack), list(bound.ids)),
        }
        if rule is not None:  # absent without a rule: checkpoints written before rules still resume
            fit_options["stop"] = rule
        fingerprint = run_fingerprint(
            spec, strategy, registry, federation, runner.name, seed, fit_options, transform
        )
    if resume_from is not None:
        ckpt = load_checkpoint(resume_from)
        mismatch = fingerprint_mismatches(ckpt.fingerprint, fingerprint)
        if mismatch:
            raise CheckpointError(
                f"checkpoint {resume_from} was written with a different " + "; different ".join(mismatch)
            )
        start, server, history = ckpt.completed_rounds, ckpt.server_state, list(ckpt.history)
        memory = ckpt.stopping or {}
    else:
        start, server, history = 0, strategy.initialize(ctx, generator(seed, "init")), []
        memory = {}
    failures: list[dict] = []
    # The rule's memory: the latest states (as matrices) and, once met, why the run stopped.
    recent: list[torch.Tensor] = list(memory.get("states", []))
    reason: str | None = memory.get("reason")

    def checkpoint(done: int) -> None:
        stopping = None if rule is None else {"states": recent, "reason": reason}
        save_checkpoint(checkpoint_path, Checkpoint(done, server, history, fingerprint, stopping=stopping))

    bar = progress_bar(
        range(start, rounds), progress=progress, desc=type(strategy).__name__, initial=start, total=rounds
    )
    for rnd in bar:
        if reason is not None:  # resumed from a checkpoint of a run that had already stopped
            break
        plan = strategy.configure(rnd, server, ctx, generator(seed, "configure", rnd))
        tamper = None if bound is None else bound.tamper(rnd, plan)
        done = exchange(runner, "train", rnd, plan, registry.ids, min_replies, options, tamper, transform)
        server, metrics = strategy.aggregate(rnd, server, plan, done.replies, ctx)
        failed = done.replies.failures
        row = {"round": rnd + 1, **metrics}
        row.update(
            failed=len(failed),
            failures=_failure_summary(failed, registry.ids),
            bytes_down=done.bytes_down,
            bytes_up=done.bytes_up,
        )
        failures.extend({"round": rnd + 1, "client": registry.ids[p], "reason": r} for p, r in failed.items())
        if rule is not None:
            if rule.memory:
                recent = [*recent, state_rows(strategy.global_state(server))][-rule.memory :]
            nll = [r.get("train_nll", math.nan) for r in history] + [metrics.get("train_nll", math.nan)]
            reason = rule.check(recent, nll)
        last = rnd + 1 == rounds or reason is not None
        if eval_every and ((rnd + 1) % eval_every == 0 or last):
            row.update(_summarise(evaluate_clients(strategy, server, ctx, runner, registry, transform)))
        row.update(strategy.describe(server))
        history.append(row)
        if callback is not None:
            callback(rnd + 1, server)
        if "train_nll" in metrics and not math.isnan(metrics["train_nll"]):
            bar.set_postfix(train_nll=f"{metrics['train_nll']:.4f}", refresh=False)
        if checkpoint_every and ((rnd + 1) % checkpoint_every == 0 or last):
            checkpoint(rnd + 1)
    bar.close()
    frame = pd.DataFrame(history)
    frame.attrs["transforms"] = transform.describe()  # what every round's data were in
    if rule is not None:
        _report_stop(frame, rule, reason, len(history))
    return FitResult(
        spec,
        strategy,
        federation,
        server,
        frame,
        seed,
        runner,
        registry,
        pd.DataFrame(failures, columns=["round", "client", "reason"]),
        [] if bound is None else list(bound.ids),
        transform,
    )
