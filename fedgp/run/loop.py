"""``Run``: one federated training run as an object — start, one round at a time, finish.

The round loop lives here, once, for every engine, and never runs client code::

    run = Run(spec, federation, strategy, rounds, engine=..., ...).start()  # hello, transforms, init
    while not run.done:
        run.round()        # configure → exchange (messages out, replies and failures back) → aggregate
    result = run.finish()  # a FitResult; an engine the run built is closed (run.close())

What happens around each round — the stopping rule, evaluation, checkpoints, progress, your own
code — is a list of :mod:`callbacks <fedgp.run.callbacks>`; a new concern is a new callback, not a
new branch here. :func:`fedgp.fit` is this loop with its defaults.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from fedgp import defaults
from fedgp.data.client import Federation, check_trainable
from fedgp.engines.arrivals import Arrivals
from fedgp.engines.base import Engine
from fedgp.engines.config import EngineConfig, build_engine
from fedgp.errors import ConvergenceWarning, DivergenceWarning, InputError, InputTypeError, RoundFailedError
from fedgp.messages import ServerContext
from fedgp.models.own_features import OwnFeaturesSpec
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.run.callbacks import (
    Callback,
    Checkpointing,
    Evaluate,
    Progress,
    StateColumns,
    Stopping,
    as_callback,
)
from fedgp.run.exchange import distinct_participants, exchange, exchange_arrivals, send_transform
from fedgp.run.faults import Faults
from fedgp.run.fingerprint import run_fingerprint
from fedgp.run.privacy import ClientDP, PrivacyAccounting
from fedgp.run.result import FitResult
from fedgp.run.stopping import StopRule, resolve_stop
from fedgp.run.summary import check_claimed_sizes, learn_transform
from fedgp.strategies.base import Strategy
from fedgp.strategies.fgpr import FGPR
from fedgp.transforms import Transforms

__all__ = ["Run"]


def _sized(spec: GPSpec, federation: Federation | None, engine) -> GPSpec:
    """``spec`` with its modules given by name (``GPSpec()``'s default kernel) built for the data's
    width: the federation's, or that of the clients an engine passed in hosts."""
    if federation is not None:
        return spec.for_inputs(federation.n_features)
    spec = spec.for_data(getattr(engine, "clients", None) or [])
    if spec.sizes_later:
        raise InputError(
            f"{spec!r} builds its named kernel or mean for the data's width, which fit learns from the "
            "federation; with federation=None (the clients are remote) give the width: "
            "GPSpec(..., input_dim=d)"
        )
    return spec


class Run:
    """A training run of ``strategy`` on ``federation``; the arguments are :func:`fedgp.fit`'s.

    Attributes, as the callbacks see them: ``completed`` rounds, ``rounds`` (the budget),
    ``server`` (the strategy's server state), ``state`` (its global hyper-parameters),
    ``history`` (one dict per round), ``failures`` (one dict per failed client and round),
    ``roster`` and ``context`` (what registration told the server), ``transform`` (the learned
    data transforms), ``engine``, ``callbacks``; after :meth:`stop`, ``stop_reason``; with a
    stopping rule, ``divergence`` says why the run diverges (or ``None``): its training NLL rose
    above its best before the rule held, or while the budget ran out.
    """

    def __init__(
        self,
        spec: GPSpec,
        federation: Federation | None,
        strategy: Strategy | ClientDP | None = None,
        rounds: int = defaults.ROUNDS,
        *,
        engine: str | EngineConfig | Engine = defaults.ENGINE,
        seed: int = defaults.SEED,
        transforms: Transforms | str | None = defaults.TRANSFORMS,
        faults: Faults | None = None,
        stop: StopRule | str | None = defaults.STOP,
        callbacks: Iterable[Callback | Callable] = (),
    ):
        if not isinstance(spec, GPSpec):
            raise InputTypeError(
                f"spec must be a fedgp.GPSpec (the model: mean, kernel, likelihood), got "
                f"{type(spec).__name__}; e.g. fedgp.GPSpec(kernel=gpytorch.kernels.RBFKernel())"
            )
        strategy = FGPR() if strategy is None else strategy
        privacy = strategy if isinstance(strategy, ClientDP) else None
        if privacy is None and not isinstance(strategy, Strategy):
            raise InputTypeError(
                f"strategy must be a fedgp.strategies.Strategy (e.g. fedgp.strategies.FGPR()) or one "
                f"made private, fedgp.run.ClientDP(FGPR(), ...); got {type(strategy).__name__}"
            )
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise InputError(f"rounds must be an int >= 1, got {rounds!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise InputTypeError(f"seed must be an int (every random draw derives from it), got {seed!r}")
        if federation is not None and not isinstance(federation, Federation):
            raise InputTypeError(
                f"federation must be a fedgp.data.Federation, got {type(federation).__name__}"
            )
        spec = _sized(spec, federation, engine)
        self.accounted_rate: float | None = None  # the sampling rate the privacy accountant may use
        if privacy is not None:
            # An engine that releases no sum of fewer than m nodes (secure aggregation) skips rounds
            # that sampled fewer: no amplification by sampling then (ClientDP.accounted_rate).
            self.accounted_rate = privacy.accounted_rate(getattr(engine, "min_nodes_per_sum", 1))
            hosted = federation if federation is not None else getattr(engine, "clients", None) or ()
            strategy = privacy.build(spec, rounds, self.accounted_rate, len(hosted) or 2)
            transforms = privacy.transforms(Transforms.of(transforms))
        self.privacy = privacy  # the ClientDP the strategy came wrapped in, or None
        faults = Faults() if faults is None else faults
        if not isinstance(faults, Faults):
            raise InputTypeError(f"faults must be a fedgp.run.Faults, got {type(faults).__name__}")
        self.spec, self.strategy, self.rounds, self.seed = spec, strategy, rounds, seed
        self.transforms, self.faults, self.rule = Transforms.of(transforms), faults, resolve_stop(stop)
        self.callbacks = self._callbacks(callbacks)
        if isinstance(spec, OwnFeaturesSpec) and federation is not None:
            spec.check_federation(federation)  # its columns are the core: before an engine checks widths
        self.engine = build_engine(engine, spec, None if federation is None else list(federation), seed)
        self._owns_engine = not isinstance(engine, Engine)  # built here: closed by close()
        if strategy.keeps_client_memory and not self.engine.keeps_client_memory:
            self.close()
            raise InputError(
                f"{type(strategy).__name__}: its clients keep values of their own between rounds "
                f"(personal hyper-parameters), which the {self.engine.name!r} engine does not keep yet; "
                "use engine='sequential', 'batched', 'ray' or 'flower'"
            )
        if isinstance(spec, OwnFeaturesSpec):
            self._check_own_features(federation, strategy)
        if getattr(strategy, "arrival_driven", False) and not isinstance(self.engine, Arrivals):
            self.close()
            raise InputError(
                f"{type(strategy).__name__}(speeds='measured') times replies as they arrive, which the "
                f"{self.engine.name!r} engine does not return (it runs its clients in this process, so "
                "nothing arrives late); run it on Flower (engine=fedgp.flower.Flower(...) or a "
                "deployment), or simulate the speeds: speeds=(...) or LogUniform(spread=10)"
            )
        if federation is None and getattr(self.engine, "clients", None):
            federation = Federation(list(self.engine.clients))
        self.federation = federation
        self.completed, self.server = 0, None
        self.history: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.divergence: str | None = None
        self._fingerprint: dict[str, str] | None = None

    def _check_own_features(self, federation: Federation | None, strategy: Strategy) -> None:
        """Owners with own features (:mod:`fedgp.models.own_features`) run under FGPR on the sequential
        engine, whose ops complete each owner's model with its own part; refuse anything else, saying why."""
        reason = None
        if self.engine.name != "sequential":
            reason = (
                f"the {self.engine.name!r} engine evaluates every client's model from the shared spec alone "
                "(it would leave the owners' own columns out); use engine='sequential'"
            )
        elif self.privacy is not None or type(strategy) is not FGPR:
            reason = (
                f"{type(self.privacy or strategy).__name__}: the owners' own parts are trained under "
                "FGPR only (one state per owner, no noise added to replies); use strategy=FGPR(...)"
            )
        elif federation is None:
            reason = "the federation's clients must be given (federation=spec.federation(clients))"
        elif any(isinstance(c, Checkpointing) and c.resume for c in self.callbacks):
            reason = (
                "Checkpointing(resume=True): a checkpoint holds the shared state, not the owners' own parts, "
                "which a resumed run would restart from their initial values"
            )
        if reason is not None:
            self.close()
            raise InputError(f"OwnFeaturesSpec: {reason}")

    def _callbacks(self, given: Iterable[Callback | Callable] | None) -> list[Callback]:
        given = () if given is None else given
        if isinstance(given, (Callback, str, bytes)) or callable(given) or not isinstance(given, Iterable):
            raise InputTypeError(
                "callbacks must be a list of callbacks, e.g. callbacks=[fedgp.run.Progress(False)], "
                f"got {type(given).__name__}"
            )
        chosen = [as_callback(c) for c in given]
        built_in: list[Callback] = [StateColumns()]
        if self.rule is not None:
            built_in.append(Stopping(self.rule))
        if self.privacy is not None:
            built_in.append(PrivacyAccounting(self.privacy, self.accounted_rate))
        # Under ClientDP per-client test metrics leave the clients outside the guarantee: only when asked.
        standard = (Progress,) if self.privacy is not None else (Evaluate, Progress)
        for kind in standard:  # the standard ones, unless the user configured their own
            if not any(isinstance(c, kind) for c in chosen):
                built_in.append(kind())
        return sorted(built_in + chosen, key=lambda c: c.order)

    # -- the loop ----------------------------------------------------------------------------------
    def start(self) -> Run:
        """Register the clients, learn the data transforms, initialise (or restore) the server
        state, and tell the callbacks."""
        self.roster = self.engine.start(self.strategy, self.seed)
        self.engine.transform_sent = None  # registered: the clients hold their data as they are
        for client_id, n in zip(self.roster.ids, self.roster.sizes.tolist()):  # remote clients too
            check_trainable(client_id, n)
        self.transform, summary = learn_transform(
            self.engine, self.roster, self.transforms, self.spec, self.faults.min_contributors,
            self.faults.min_replies,
        )  # fmt: skip
        self.failures.extend({"round": 0, "client": self.roster.ids[p], "reason": f"summarise: {r}"}
                             for p, r in summary.failures.items())  # fmt: skip
        self.roster = check_claimed_sizes(self.roster, summary)
        send_transform(self.engine, self.roster, self.transform)
        self.context = ServerContext.from_roster(self.spec, self.roster, self.seed)
        self.attack = self.faults.bind(self.strategy, self.spec, self.roster.ids, self.seed)
        self.options = self.faults.task_options(self.attack)
        self.server = self.strategy.initialize(self.context, generator(self.seed, "init"))
        for callback in self.callbacks:
            callback.restore(self)
        for callback in self.callbacks:
            callback.on_start(self)
        return self

    @property
    def done(self) -> bool:
        """Whether the run has ended: the budget is spent or a callback stopped it."""
        return self.completed >= self.rounds or self.stop_reason is not None

    def round(self) -> dict[str, Any]:
        """Run round ``completed + 1``; its history row."""
        rnd = self.completed
        plan = self.strategy.configure(rnd, self.server, self.context, generator(self.seed, "configure", rnd))
        tamper = None if self.attack is None else self.attack.tamper(rnd, plan)
        try:
            if getattr(self.strategy, "arrival_driven", False):  # replies consumed as they arrive
                sent = exchange_arrivals(
                    self.engine, rnd, plan, self.strategy.awaited(self.server),
                    self.strategy.sent_versions(self.server), self.strategy.awaiting(self.server),
                    self.options, tamper,
                )  # fmt: skip
            else:
                sent = exchange(
                    self.engine, "train", rnd, plan, self.roster.ids, self.faults.min_replies, self.options,
                    tamper, self._min_contributors(),
                )  # fmt: skip
        except RoundFailedError as err:
            if self.privacy is None or err.withheld is None:
                raise
            return self._skip(rnd, plan, err)
        self.server, metrics = self.strategy.aggregate(rnd, self.server, plan, sent.replies, self.context)
        failed = sent.replies.failures
        ids = self.roster.ids
        row = {"round": rnd + 1, **metrics}
        row.update(
            participants=sent.asked,
            failed=len(failed),
            failures=" | ".join(f"{ids[p]!r}: {reason}" for p, reason in failed.items()),
            bytes_down=sent.bytes_down,
            bytes_up=sent.bytes_up,
        )
        if self.privacy is not None:
            row["skipped"] = False
        self.failures.extend({"round": rnd + 1, "client": ids[p], "reason": r} for p, r in failed.items())
        return self._complete(row)

    def _complete(self, row: dict[str, Any]) -> dict[str, Any]:
        self.completed = row["round"]
        self.history.append(row)
        for callback in self.callbacks:
            callback.on_round(self, row)
        return row

    def _skip(self, rnd: int, plan, err: RoundFailedError) -> dict[str, Any]:
        """Round ``rnd + 1`` of a run under :class:`ClientDP` whose sums were withheld (Poisson
        sampling drew fewer nodes than secure aggregation releases a sum of, or nodes were lost
        mid-protocol): skipped, not the end of the run. The server state stays as it was, the row
        says ``skipped`` and its failures say why, and the round is accounted like every other (its
        sampling happened); :meth:`ClientDP.accounted_rate` gives the privacy argument, and why the
        round is not topped up instead."""
        failures = err.failures
        row = {
            "round": rnd + 1,
            "participants": len(distinct_participants(plan)[0]),
            "failed": len(failures),
            "failures": " | ".join(f"{cid!r}: {reason}" for cid, reason in failures.items()),
            "bytes_down": err.bytes_down,
            "bytes_up": err.bytes_up,
            "skipped": True,
        }
        self.failures.extend({"round": rnd + 1, "client": cid, "reason": r} for cid, r in failures.items())
        return self._complete(row)

    def _min_contributors(self) -> int:
        """The fewest contributions a training round's sums may add up. Under client-level DP the
        noise, calibrated to one client's clipped update, is what bounds a small sum: a round that
        sampled one client releases its noised step like any other."""
        return 1 if self.privacy is not None else self.faults.min_contributors

    def stop(self, reason: str) -> None:
        """End the run after the current round (a callback's way to stop it), saying why."""
        self.stop_reason = reason

    def finish(self) -> FitResult:
        """Tell the callbacks, record why the run ended, :meth:`close`, and return the result."""
        for callback in self.callbacks:
            callback.on_end(self)
        frame = pd.DataFrame(self.history)
        frame.attrs["transforms"] = self.transform.describe()  # what every round's data were in
        if self.privacy is not None:
            frame.attrs["privacy"] = self.privacy_summary
        if self.rule is not None or self.stop_reason is not None:
            self._report_stop(frame)
        states = next((c.kept(self.history) for c in self.callbacks if isinstance(c, StateColumns)), None)
        if states is not None:  # every round's hyper-parameters, for the table in the data's units
            frame.attrs["states"] = states  # (last: where a loaded result's attrs have it)
        result = FitResult(
            self.spec,
            self.strategy,
            self.federation,
            self.server,
            frame,
            self.seed,
            self.engine,
            self.roster,
            pd.DataFrame(self.failures, columns=["round", "client", "reason"]),
            [] if self.attack is None else list(self.attack.ids),
            self.transform,
            self.feature_names,
        )
        self.close()
        return result

    @property
    def feature_names(self) -> tuple[str, ...] | None:
        """The input columns' names: the federation's, or (with no federation here, as on a Flower
        grid) the engine's, which learned them at registration; ``None`` when nobody named them."""
        if self.federation is not None:
            return self.federation.feature_names
        return getattr(self.engine, "feature_names", None)

    def close(self) -> None:
        """Close the engine if this run built it (from a name or a config): a Ray the run started
        stops, unless ``fedgp.engines.Ray(keep_alive=True)``. The result still predicts and
        evaluates through it. An :class:`~fedgp.engines.base.Engine` passed in is its owner's to
        close. :meth:`finish` calls this, and :func:`fedgp.fit` also when the run fails."""
        if self._owns_engine:
            self.engine.close()

    # -- what callbacks use ----------------------------------------------------------------------------
    @property
    def server_state(self) -> Any:
        """The strategy's server state (``server``), by the name :class:`FitResult` gives it."""
        return self.server

    @property
    def state(self) -> HyperState:
        """The global hyper-parameters of the current server state."""
        return self.strategy.global_state(self.server)

    def resume_from(self, completed: int, server: Any, history: list[dict], failures: list[dict]) -> None:
        """Continue after round ``completed`` with this server state, history and failures."""
        self.completed, self.server = int(completed), server
        self.history, self.failures = list(history), list(failures)

    def fingerprint(self) -> dict[str, str]:
        """What a checkpoint of this run records and a resumed run must match (hashes all data, so
        computed only when asked)."""
        if self._fingerprint is None:
            options = self.faults.fingerprint(self.attack)
            for callback in self.callbacks:
                options.update(callback.fingerprint(self))
            self._fingerprint = run_fingerprint(
                self.spec, self.strategy, self.roster, self.federation, self.engine.name, self.seed, options,
                self.transform,
            )  # fmt: skip
        return self._fingerprint

    def _report_stop(self, frame: pd.DataFrame) -> None:
        """Record why the run ended; warn when it spent its budget without meeting its rule, and
        say whether it diverges or needs more rounds."""
        done, rule = self.completed, self.rule
        frame.attrs["stopped"] = self.stop_reason is not None and self.divergence is None
        frame.attrs["diverging"] = self.divergence is not None
        if self.divergence is not None:
            # The budget ran out while the objective rose, or a rule held after it rose (a settled
            # state or flat windows far above the best): either way, not convergence.
            when = f"after {done} rounds"
            if self.stop_reason is not None:
                when = f"at round {done} the stopping rule held ({self.stop_reason}), but"
            frame.attrs["stop_reason"] = f"diverging: {when} {self.divergence}"
            warnings.warn(
                f"fit diverges: {when} {self.divergence}, so the run did not converge. "
                "Its training objective rises when local steps overshoot or client drift wins: "
                "lower the strategy's lr or let it decay (lr_schedule=...), take full-batch local "
                "steps (batch_size=None), or move the adaptivity to the server "
                "(server_optimizer=...); result.history's stop_* columns show the rule round by round",
                DivergenceWarning,
                stacklevel=4,
            )
            return
        if self.stop_reason is not None:
            frame.attrs["stop_reason"] = f"round {done}: {self.stop_reason}"
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
            stacklevel=4,
        )
