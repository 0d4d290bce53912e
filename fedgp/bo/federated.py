"""``FederatedBO``: every owner proposes on its personalised federated posterior; the federation then
updates the shared hyper-parameters from where it was.

Per iteration, owner k builds ``result.to_botorch(k)`` (the shared hyper-parameters conditioned on
its own points, frozen: :mod:`fedgp.export.botorch_model`) and maximises the acquisition on it; once
every owner has evaluated and kept its new row, the strategy runs ``rounds`` more rounds on the
owners' data as they now are. Those rounds are *warm-started*: the new :class:`~fedgp.run.Run`
resumes from the previous run's server state (a server optimiser's moments included), round count
and history, exactly as a checkpoint resumes a run (:meth:`fedgp.run.Run.resume_from`), so the
round numbers, and every per-round random draw, continue instead of restarting. Only ``start``
trains from the spec's initial state (``initial_rounds`` rounds).

The data never leave their owner's ClientData: the engine runs the clients' side where the data
are, as in :func:`fedgp.fit`. In-process engines (``"sequential"``, ``"batched"``) only for now.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedgp.bo.acquisition import Acquisition, acquisition_seed
from fedgp.bo.batched import BATCHABLE, batched_model, propose_all
from fedgp.bo.budget import LoopBudget
from fedgp.bo.method import Method
from fedgp.data.client import ClientData, Federation
from fedgp.errors import InputError, InputTypeError, import_extra
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.models.own_features import OwnFeaturesSpec
from fedgp.models.spec import GPSpec
from fedgp.rng import generator
from fedgp.run.callbacks import Callback, Evaluate, Progress
from fedgp.run.faults import Faults
from fedgp.run.loop import Run
from fedgp.run.privacy import ClientDP
from fedgp.run.result import FitResult
from fedgp.strategies.base import Strategy
from fedgp.strategies.fgpr import FGPR

if TYPE_CHECKING:
    from botorch.models import SingleTaskGP

__all__ = ["FederatedBO", "WarmStart"]

ENGINES = ("sequential", "batched")
#: FederatedBO's part of a BO checkpoint folder.
SAVED = "federated.fedgp"


@dataclass
class WarmStart(Callback):
    """Resume a new run from an earlier run's ``server`` state after ``completed`` rounds, with its
    ``history`` (a callback, as :class:`~fedgp.run.Checkpointing` resumes from a file)."""

    completed: int
    server: Any
    history: list[dict[str, Any]]

    def restore(self, run) -> None:
        run.resume_from(self.completed, self.server, self.history, [])


class FederatedBO(Method):
    """Federated BO: ``strategy`` (default :class:`~fedgp.strategies.FGPR`) learns ``spec``'s shared
    hyper-parameters over the owners, ``initial_rounds`` rounds at the start and ``rounds`` more after
    every iteration, warm-started; owners propose with ``acquisition`` (a name of
    :data:`~fedgp.bo.ACQUISITIONS`, a factory ``(model, best_f, bounds) -> AcquisitionFunction``, or
    an :class:`~fedgp.bo.Acquisition`) on their personalised posteriors. ``engine``: ``"batched"``
    (default) or ``"sequential"``; ``transforms``: as :func:`fedgp.fit` (default ``None``: the
    hyper-parameters stay in the objectives' units from one iteration to the next).
    ``faults``: as :func:`fedgp.fit` (e.g. ``Faults(min_contributors=2)``).
    ``batch_proposals=True``: all owners' proposals in one BoTorch optimisation
    (:mod:`fedgp.bo.batched`; ``"qlogei"`` or ``"qucb"``, FGPR-style shared states, no transforms).

    ``strategy`` may be ``ClientDP(FGPR(), ...)``: client-level DP for the shared hyper-parameters,
    every round of every iteration accounted together (the warm start keeps the round count), the ε
    spent after each iteration in the history's ``epsilon`` column (dp-accounting's RDP accountant,
    at the ClientDP's δ). With a budget (``epsilon=``) the budget is the whole loop's
    (:mod:`fedgp.bo.budget`): without ``noise`` the noise multiplier is calibrated so that the
    planned rounds, ``initial_rounds + rounds * iterations``, cost at most ε; with ``noise`` the loop
    stops before an iteration whose rounds would pass the budget (``BOResult.stop_reason``).

    After :meth:`start`, ``result`` is the latest :class:`~fedgp.run.FitResult`."""

    name = "federated"

    def __init__(
        self,
        spec: GPSpec,
        strategy: Strategy | ClientDP | None = None,
        rounds: int = 5,
        *,
        initial_rounds: int = 50,
        engine: str = "batched",
        transforms: Any = None,
        acquisition: Acquisition | str | Any = "qlogei",
        batch_proposals: bool = False,
        faults: Faults | None = None,
    ):
        import_extra("botorch", "fedgp.bo.FederatedBO")  # before the first fit's rounds, not after
        if not isinstance(spec, GPSpec):
            raise InputTypeError(f"FederatedBO: spec must be a fedgp.GPSpec, got {type(spec).__name__}")
        if isinstance(spec, (MultiOutputSpec, OwnFeaturesSpec)):  # an owner's objective: one output on X
            raise InputError(
                f"FederatedBO: spec must model one output on the owners' search inputs, got a "
                f"{type(spec).__name__} (its inputs are not the points an owner proposes and evaluates); "
                "use a fedgp.GPSpec"
            )
        strategy = FGPR() if strategy is None else strategy
        if not isinstance(strategy, (Strategy, ClientDP)):
            raise InputTypeError(
                f"FederatedBO: strategy must be a fedgp Strategy, got {type(strategy).__name__}"
            )
        if (strategy.strategy if isinstance(strategy, ClientDP) else strategy).keeps_client_memory:
            raise InputError(
                f"FederatedBO: {type(strategy).__name__} keeps personal values on its clients, which a "
                "warm-started round does not carry from one iteration's engine to the next"
            )
        for label, value in (("rounds", rounds), ("initial_rounds", initial_rounds)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"FederatedBO: {label} must be an int >= 1, got {value!r}")
        if engine not in ENGINES:
            raise InputError(f"FederatedBO: engine must be one of {ENGINES}, got {engine!r}")
        self.spec, self.strategy, self.rounds, self.initial_rounds = spec, strategy, rounds, initial_rounds
        self.engine, self.transforms = engine, transforms
        self.acquisition = Acquisition.of(acquisition)
        if batch_proposals and self.acquisition.kind not in BATCHABLE:
            raise InputError(
                f"FederatedBO(batch_proposals=True) takes the acquisitions {BATCHABLE}, not "
                f"{self.acquisition.name!r}"
            )
        self.batch_proposals = bool(batch_proposals)
        self.faults = faults
        self.result: FitResult | None = None
        #: The loop's privacy budget (None without ``ClientDP(epsilon=...)``), planned at the start.
        self.budget: LoopBudget | None = None

    def _fit(self, loop, rounds: int, last: FitResult | None = None) -> dict[str, Any]:
        """``rounds`` more rounds on the owners' data as they are now, from the last server state
        (``self.result``'s, or ``last``'s)."""
        federation = Federation([ClientData(o.X.clone(), o.y.clone(), id=o.id) for o in loop.owners])
        return self.fit_rounds(federation, self.engine, loop.seed, rounds, last)

    def fit_rounds(
        self,
        federation: Federation | None,
        engine: Any,
        seed: int,
        rounds: int,
        last: FitResult | None = None,
    ) -> dict[str, Any]:
        """``rounds`` more rounds of the strategy on ``engine`` (a name, or an engine such as a Flower
        grid's, whose nodes hold the data: ``federation`` ``None``), warm-started from the last server
        state (``self.result``'s, or ``last``'s); the history columns of the last round."""
        callbacks: list[Callback] = [Progress(False), Evaluate(every=0)]
        done = 0
        last = self.result if last is None else last
        if last is not None:
            history = last.history.to_dict("records")
            done = len(history)
            callbacks.append(WarmStart(done, last.server_state, history))
        strategy = self.strategy if self.budget is None else self.budget.strategy
        run = Run(
            self.spec, federation, strategy, done + rounds, engine=engine, seed=seed,
            transforms=self.transforms, faults=self.faults, stop=None, callbacks=callbacks,
        )  # fmt: skip
        try:
            with run.engine.thread_setting(), warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore"
                )  # a fixed number of rounds per iteration: no convergence verdict
                run.start()
                while not run.done:
                    run.round()
                self.result = run.finish()
        finally:
            run.close()
        last = self.result.history.iloc[-1]
        out = {"round": int(last["round"]), "train_nll": float(last.get("train_nll", float("nan")))}
        if "epsilon" in last:  # ClientDP: ε after every round so far (the warm start keeps the count)
            out["epsilon"] = float(last["epsilon"])
        return out

    def start(self, loop) -> dict[str, Any]:
        self.budget = LoopBudget.plan(self.strategy, self, loop)
        return self._fit(loop, self.initial_rounds)

    def declines(self, loop, iteration: int) -> str | None:
        """Why ``iteration`` cannot run: its rounds would spend more than the loop's privacy budget."""
        if self.budget is None or self.result is None:
            return None
        return self.budget.declines(len(self.result.history), self.rounds, iteration)

    def model(self, position: int) -> SingleTaskGP:
        """Owner ``position``'s personalised BoTorch model (``to_botorch``) from the latest fit."""
        return self.result.to_botorch(position)

    def propose(self, loop, iteration: int) -> list:
        if self.batch_proposals:
            seed = int(generator(loop.seed, "bo batched acquisition", iteration).integers(2**31))
            return propose_all(self.acquisition, batched_model(self.result, loop.owners), loop.owners, seed)
        out = []
        for k, owner in enumerate(loop.owners):
            seed = acquisition_seed(loop.seed, k, iteration)
            X, _ = self.acquisition.propose(self.model(k), owner.y, owner.bounds, seed)
            out.append(X)
        return out

    def update(self, loop, iteration: int) -> dict[str, Any]:
        return self._fit(loop, self.rounds)

    def checkpoint(self, folder: Path, key: bytes | str | None = None) -> None:
        """The last federated fit (``federated.fedgp``, :meth:`FitResult.save`: its server state,
        round count and history; no owner's rows)."""
        self.result.save(Path(folder) / SAVED, key=key)

    def resume(self, loop, iteration: int, folder: Path, key: bytes | str | None = None) -> None:
        """The last fit's state back, bound to the owners' restored rows (a run of no new round); with
        a budget, its noise multiplier is the one the rounds so far were run and accounted with."""
        last = FitResult.load(Path(folder) / SAVED, key=key)
        self.budget = LoopBudget.plan(self.strategy, self, loop, used=last.history.attrs.get("privacy"))
        self._fit(loop, 0, last=last)
