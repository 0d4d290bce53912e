"""What happens around the rounds of a run, each concern one object the round loop calls.

:class:`~fedgp.run.loop.Run` calls every callback at three moments — :meth:`Callback.on_start`
before round 1 (after :meth:`Callback.restore`, where a checkpoint brings a run back),
:meth:`Callback.on_round` after every round with that round's history row, and
:meth:`Callback.on_end` — in the order of their ``order`` (lowest first; equal orders keep the
order given). The built-in ones, in that order:

* the stopping rule (``fit(stop=...)``, order −30): decides whether this round is the last;
* :class:`Evaluate` (−20): per-client test metrics into the row, every ``every`` rounds and after
  the last;
* the state columns (−10): the strategy's description of its state into the row;
* your callbacks (0 by default): a :class:`Callback`, or any function ``f(run)`` called after
  every round;
* :class:`Checkpointing` (20): writes the run so that it can resume bit for bit;
* :class:`Progress` (30): the progress display.

``fit`` adds ``Evaluate()`` and ``Progress()`` with their defaults unless ``callbacks`` holds one of
its kind, so ``callbacks=[Progress(False)]`` silences the display and ``[Evaluate(every=0)]`` skips
the test metrics.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pandas as pd
import torch

from fedgp.engines.base import Engine
from fedgp.errors import (
    CheckpointError,
    EngineError,
    FileFormatError,
    InputError,
    InputTypeError,
    MissingFileError,
)
from fedgp.messages import Roster, ServerContext
from fedgp.messages.container import check_key
from fedgp.models.state import HyperState
from fedgp.run.checkpoint import Checkpoint, fingerprint_mismatches, load_checkpoint, save_checkpoint
from fedgp.run.evaluation import evaluate_clients, mean_metrics
from fedgp.run.kept import read_kept
from fedgp.run.progress import end_early, progress_bar
from fedgp.run.stopping import StopRule, state_rows
from fedgp.run.stored import history_problems, server_problems
from fedgp.run.units import RoundStates, state_columns
from fedgp.strategies.base import Strategy
from fedgp.transforms import DataTransform

__all__ = ["Callback", "RunView", "Evaluate", "Progress", "Checkpointing", "as_callback"]


class RunView(Protocol):
    """What a callback sees of the run (:class:`fedgp.run.Run` is one): the contract callbacks may
    rely on, and nothing else."""

    strategy: Strategy
    engine: Engine
    rounds: int  # the budget
    completed: int  # rounds done, the one just finished included
    server: Any  # the strategy's server state
    history: list[dict[str, Any]]  # one row per round so far
    failures: list[dict[str, Any]]  # one row per failed client and round
    roster: Roster  # what registration told the server
    context: ServerContext
    transform: DataTransform  # the data transforms the clients hold (sent once, before round 1)
    callbacks: list[Callback]

    @property
    def state(self) -> HyperState:
        """The global hyper-parameters of the current server state."""

    @property
    def done(self) -> bool:
        """Whether the run has ended (budget spent, or stopped)."""

    def stop(self, reason: str) -> None:
        """End the run after the current round, saying why."""

    def fingerprint(self) -> dict[str, str]:
        """What a checkpoint of the run records and a resumed run must match."""

    def resume_from(self, completed: int, server: Any, history: list[dict], failures: list[dict]) -> None:
        """Continue after round ``completed`` with this server state, history and failures."""


class Callback:
    """Subclass and override the moments you need; each gets the run (:class:`RunView`: ``completed``
    rounds, ``rounds`` (the budget), ``server`` (the strategy's server state), ``state`` (the global
    hyper-parameters), ``history`` (one dict per round so far), ``roster``, ``context``, ``engine``,
    ``transform``; ``run.stop(reason)`` ends the run after the current round).
    """

    #: Where the callback runs among the others (lowest first).
    order: ClassVar[int] = 0
    #: The name its :meth:`state` is checkpointed under (``None``: it keeps nothing).
    checkpoint_key: ClassVar[str | None] = None

    def restore(self, run: RunView) -> None:
        """Before :meth:`on_start`: bring the run back from where it was saved (checkpoints)."""

    def on_start(self, run: RunView) -> None:
        """Before the first round of this session (round ``run.completed + 1``)."""

    def on_round(self, run: RunView, row: dict[str, Any]) -> None:
        """After round ``run.completed``; ``row`` is its history row (add columns to it here)."""

    def on_end(self, run: RunView) -> None:
        """After the last round."""

    def fingerprint(self, run: RunView) -> dict[str, str]:
        """Settings that change the run's result or history, for a checkpoint's fingerprint."""
        return {}

    def state(self) -> Any:
        """What a checkpoint keeps of the callback (see :attr:`checkpoint_key`)."""
        return None

    def load_state(self, state: Any) -> None:
        """Take back what :meth:`state` returned, from a checkpoint."""


@dataclass
class _Function(Callback):
    """A plain function ``f(run)``, called after every round."""

    function: Callable[[Any], Any]

    def on_round(self, run, row):
        self.function(run)


def as_callback(callback: Callback | Callable) -> Callback:
    """A callback object, or a function ``f(run)`` called after every round."""
    if isinstance(callback, Callback):
        return callback
    if callable(callback):
        return _Function(callback)
    raise InputTypeError(
        f"callbacks must be fedgp.run.Callback objects or functions f(run), got {type(callback).__name__}"
    )


# -- built into every run -------------------------------------------------------------------------


class Stopping(Callback):
    """The stopping rule of ``fit(stop=...)``: checked after every round, its statistics written
    into the round's row (``stop_*`` columns). Whenever the rule holds, the training NLL is checked
    for a rise above its best (``StopRule.risen``): a rule that holds after a rise ends the run as
    diverging (``run.divergence``), never as converged. When the budget runs out, the rule is asked
    whether the run diverges. Its memory (the latest states, as matrices, and once met why the run
    stopped) goes into checkpoints, so a resumed run stops at the same round as an unbroken one."""

    order = -30
    checkpoint_key = "stopping"

    def __init__(self, rule: StopRule):
        self.rule = rule
        self.recent: list[torch.Tensor] = []
        self.reason: str | None = None
        self.rise: str | None = None

    def on_start(self, run):
        if self.reason is not None:  # resumed from a checkpoint of a run that had already stopped
            run.divergence = self.rise
            run.stop(self.reason)

    def on_round(self, run, row):
        if row.get("skipped"):  # a round skipped under ClientDP left the state as it was: no evidence
            return
        if self.rule.memory:
            self.recent = [*self.recent, state_rows(run.state)][-self.rule.memory :]
        nll = self._nll(run)
        row.update({f"stop_{k}": v for k, v in self.rule.statistics(self.recent, nll).items()})
        self.reason = self.rule.check(self.recent, nll)
        if self.reason is not None:
            self.rise = run.divergence = self.rule.risen(nll)
            run.stop(self.reason)

    def on_end(self, run):
        if run.stop_reason is None:  # the budget ran out: diverging, or short of rounds?
            run.divergence = self.rule.diverging(self.recent, self._nll(run))

    @staticmethod
    def _nll(run) -> list[float]:
        return [r.get("train_nll", math.nan) for r in run.history]

    def fingerprint(self, run):
        return {"stop": repr(self.rule)}

    def state(self):
        return {"states": self.recent, "reason": self.reason, "rise": self.rise}

    def load_state(self, state):
        self.recent, self.reason = list(state.get("states", [])), state.get("reason")
        self.rise = state.get("rise")


class StateColumns(Callback):
    """The strategy's description of its server state (``Strategy.describe``) in every row, and,
    where that description is the global state itself (the default ``describe``), the state: the
    run keeps it (``history.attrs["states"]``, :class:`~fedgp.run.units.RoundStates`), so that the
    history in the data's units is written from states, not parsed back from column names
    (:mod:`fedgp.run.units`). The kept states go into checkpoints."""

    order = -10
    checkpoint_key = "states"

    def __init__(self) -> None:
        self.rounds: list[int] = []
        self.states: list[HyperState] = []

    def on_round(self, run, row):
        columns = run.strategy.describe(run.server)
        row.update(columns)
        if columns:  # checked against the columns once, at the end (kept): not on every round's path
            self.rounds.append(int(row["round"]))
            self.states.append(run.state.clone())

    def kept(self, history: list[dict[str, Any]]) -> RoundStates | None:
        """The states of every round of ``history``, where they are its state columns; ``None``
        where some round has none (a run resumed from a checkpoint that kept none: the history's
        columns then give them, :meth:`RoundStates.from_columns`) or the strategy describes its
        state by other columns."""
        rows = {int(r["round"]): r for r in history}
        if not self.rounds or not set(rows) <= set(self.rounds):
            return None
        kept = RoundStates.stack(self.rounds, self.states)  # None unless every state has one shape
        names = set(state_columns(self.states[0])) if kept is not None else set()
        return kept if all(row.keys() >= names for row in rows.values()) else None

    def state(self):
        return {"rounds": list(self.rounds), "states": HyperState.stack(self.states) if self.states else None}

    def load_state(self, state):
        rounds, states = list(state["rounds"]), state["states"]
        count = 0 if states is None else states.batch_shape[0]
        if len(rounds) != count or not all(isinstance(r, int) for r in rounds):
            raise InputError(f"{len(rounds)} rounds and {count} kept states")
        self.rounds = rounds
        self.states = [states.index(i) for i in range(count)]


# -- chosen by the user -----------------------------------------------------------------------------


@dataclass
class Evaluate(Callback):
    """Per-client test metrics after every ``every`` rounds and after the last: each client
    conditions its personal state on its own training data and scores its own test split; the
    row gets ``test_rmse_mean/std`` and ``test_nll_mean/std`` (original units).

    ``every=None`` (default): every round if some client has a test split, else never; ``0``: never.
    """

    every: int | None = None
    order: ClassVar[int] = -20

    def __post_init__(self) -> None:
        if self.every is not None and (
            isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0
        ):
            raise InputError(f"Evaluate(every=...) must be None or an int >= 0, got {self.every!r}")

    def interval(self, run) -> int:
        """Every how many rounds this run evaluates (0: never)."""
        if self.every is not None:
            return self.every
        return 1 if bool((run.roster.n_test > 0).any()) else 0

    def on_round(self, run, row) -> None:
        every = self.interval(run)
        if every and (run.completed % every == 0 or run.done):
            row.update(mean_metrics(evaluate_clients(run)))

    def fingerprint(self, run) -> dict[str, str]:
        return {"evaluate.every": str(self.interval(run))}


@dataclass
class Progress(Callback):
    """The progress display over rounds (:mod:`fedgp.run.progress`): ``show=None`` (default) a tqdm
    bar on a terminal and nothing otherwise; ``True`` the bar on a terminal, else a line on stderr
    every ``every`` rounds (default a tenth of them, for logs); ``False`` nothing. The bar shows the
    latest ``train_nll``; its total is the round budget, and when a stopping rule ends the run
    early, the rounds run (the bar ends at 100 %)."""

    show: bool | None = None
    every: int | None = None
    order: ClassVar[int] = 30

    def on_start(self, run) -> None:
        self._bar = progress_bar(
            progress=self.show,
            desc=type(run.strategy).__name__,
            initial=run.completed,
            total=run.rounds,
            every=self.every,
        )

    def on_round(self, run, row) -> None:
        nll = row.get("train_nll")
        if nll is not None and not math.isnan(nll):
            self._bar.set_postfix(train_nll=f"{nll:.4f}", refresh=False)
        self._bar.update(1)

    def on_end(self, run) -> None:
        if run.done and run.completed < run.rounds:  # stopped early: end at 100 %, not "12/100"
            end_early(self._bar)
        self._bar.close()


@dataclass
class Checkpointing(Callback):
    """Write the run to ``path`` every ``every`` rounds and after the last (``every=None``: never
    write), and with ``resume=True`` continue from the checkpoint at ``path``, which must exist.

    A resumed run ends bit-identical to an unbroken one: every random draw is a function of
    ``(seed, stream, round, client)``, and the checkpoint holds the round count, the server state,
    the history, the stopping rule's memory and what the clients keep (their personal
    hyper-parameters, by client id: :meth:`fedgp.engines.Engine.read_client_memory`). It also
    holds a fingerprint of the run (spec, strategy, data, engine, seed, faults, stopping rule,
    evaluation); resuming with a different one is refused, naming what differs. Files:
    :mod:`fedgp.run.checkpoint`.
    """

    path: str | os.PathLike
    every: int | None = 1
    resume: bool = False
    #: Seal the file with an HMAC-SHA256 under this key (bytes or a string), and resume only from a
    #: file sealed with it. Without a key the file's SHA-256 catches damage, not a crafted file.
    key: bytes | str | None = field(default=None, repr=False)
    order: ClassVar[int] = 20

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise InputTypeError(
                f"Checkpointing(path=...) must be a file path (str or os.PathLike), got {self.path!r}"
            )
        if self.every is not None and (
            isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1
        ):
            raise InputError(f"Checkpointing(every=...) must be None or an int >= 1, got {self.every!r}")
        if self.every is None and not self.resume:
            raise InputError(
                "Checkpointing(every=None, resume=False) would neither write nor read a checkpoint"
            )
        check_key(self.key)

    def restore(self, run) -> None:
        if not self.resume:
            return
        if not Path(self.path).exists():
            raise MissingFileError(f"Checkpointing(resume=True): no checkpoint at {self.path}")
        ckpt = load_checkpoint(self.path, self.key)
        mismatch = fingerprint_mismatches(ckpt.fingerprint, run.fingerprint())
        if mismatch:
            raise CheckpointError(
                f"checkpoint {self.path} was written with a different " + "; different ".join(mismatch)
            )
        if type(ckpt.server_state) is not type(run.server):
            raise CheckpointError(
                f"checkpoint {self.path}: server_state is a {type(ckpt.server_state).__name__}, but this "
                f"run's strategy keeps a {type(run.server).__name__}"
            )
        # Checked as a saved result is (fedgp.run.stored): against the state this run starts from.
        problems = server_problems(ckpt.server_state, run.server, run.spec)
        problems += history_problems(pd.DataFrame(ckpt.history), None)
        last = ckpt.history[-1].get("round") if ckpt.history else 0
        if last != ckpt.completed_rounds:
            problems.append(
                f"completed_rounds is {ckpt.completed_rounds}, but its history's last round is {last!r}"
            )
        if problems:
            raise CheckpointError(f"checkpoint {self.path}: {'; '.join(problems[:3])}")
        self._restore_memory(run, ckpt)
        run.resume_from(ckpt.completed_rounds, ckpt.server_state, ckpt.history, ckpt.failures)
        for callback in run.callbacks:
            if callback.checkpoint_key in ckpt.callbacks:
                try:
                    callback.load_state(ckpt.callbacks[callback.checkpoint_key])
                except Exception as err:  # noqa: BLE001 - a crafted state: refuse, naming file and field
                    raise CheckpointError(
                        f"checkpoint {self.path}: callbacks[{callback.checkpoint_key!r}] is not a state "
                        f"{type(callback).__name__} can take back ({type(err).__name__}: {err})"
                    ) from err

    def _restore_memory(self, run, ckpt: Checkpoint) -> None:
        """Give the clients back what they kept (personal hyper-parameters), checked against the run
        as a saved result's are (:mod:`fedgp.run.kept`)."""
        keeps = run.strategy.keeps_client_memory
        if keeps and ckpt.client_memory is None:
            raise CheckpointError(
                f"checkpoint {self.path}: the clients keep values of their own between rounds (personal "
                "hyper-parameters), but the checkpoint holds none (its engine's clients keep them where this "
                "process cannot read them, or an earlier fedgp wrote it): a resumed run would restart "
                "them from their initial values"
            )
        if not keeps and ckpt.client_memory is not None:
            raise CheckpointError(
                f"checkpoint {self.path}: holds client_memory, but this run's clients keep none"
            )
        if keeps:
            try:
                names = run.strategy.kept_names(run.spec)
                kept = read_kept(ckpt.client_memory, run.spec, names, run.roster.ids, "client_memory")
            except FileFormatError as err:
                raise CheckpointError(f"checkpoint {self.path}: {err}") from None
            run.engine.write_client_memory(kept)

    def on_round(self, run, row) -> None:
        if self.every and (run.completed % self.every == 0 or run.done):
            states = {c.checkpoint_key: c.state() for c in run.callbacks if c.checkpoint_key}
            kept = _client_memory(run)
            checkpoint = Checkpoint(
                run.completed, run.server, run.history, run.fingerprint(), run.failures, states, kept
            )
            save_checkpoint(self.path, checkpoint, self.key)


def _client_memory(run) -> dict | None:
    """What the run's clients keep, for its checkpoint; ``None`` where they keep nothing, or keep it
    where this process cannot read it (a deployment's nodes: resuming then refuses, saying so)."""
    if not run.strategy.keeps_client_memory:
        return None
    try:
        return run.engine.read_client_memory()
    except EngineError:
        return None
