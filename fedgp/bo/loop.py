"""``BOLoop``: K owners optimising their own black boxes, one iteration at a time.

::

    loop = BOLoop(owners, FederatedBO(spec, FGPR(), rounds=5), iterations=20, seed=0).start()
    while not loop.done:
        loop.step()      # every owner proposes (the method), evaluates its objective, keeps its rows;
                         # then the method learns (the federation updates its hyper-parameters)
    result = loop.finish()
    result.history       # one row per (iteration, owner): best value, simple regret, seconds

Iteration 0 is the owners' starting points: ``initial`` uniform points in each owner's box (drawn
from ``(seed, owner)``), for owners that have fewer. The loop is the same for every
:class:`~fedgp.bo.method.Method`, so methods compare on the same owners, starts and seeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from fedgp.bo.callbacks import BOCallback, as_bo_callback
from fedgp.bo.method import Method
from fedgp.bo.owner import DTYPE, Owner
from fedgp.errors import InputError, InputTypeError
from fedgp.rng import generator

__all__ = ["BOLoop", "BOResult", "uniform_points"]


def uniform_points(bounds: torch.Tensor, n: int, seed: int, stream: str, *path: int) -> torch.Tensor:
    """``n`` uniform points in the box ``bounds`` drawn from ``(seed, stream, *path)``."""
    u = torch.as_tensor(generator(seed, stream, *path).uniform(size=(n, bounds.shape[1])), dtype=DTYPE)
    return bounds[0] + u * (bounds[1] - bounds[0])


@dataclass
class BOResult:
    """What a loop leaves: ``history`` (one row per iteration and owner), the ``owners`` with all
    their evaluations, the ``method`` (e.g. :class:`~fedgp.bo.FederatedBO`, whose ``result`` is the
    last federated fit), why it stopped, and (on Flower, :class:`~fedgp.bo.FlowerBO`) the owners
    dropped with the reason."""

    history: pd.DataFrame
    owners: list[Owner]
    method: Method
    stop_reason: str | None = None
    failures: pd.DataFrame | None = None

    def summary(self) -> pd.DataFrame:
        """Per iteration: the owners' mean and median simple regret and mean best value."""
        return self.history.groupby("iteration").agg(
            mean_regret=("regret", "mean"),
            median_regret=("regret", "median"),
            mean_best=("best_observed", "mean"),
        )


class _Driven:
    """What every BO loop does around its iterations (this module's and Flower's,
    :class:`~fedgp.bo.deployment.FlowerBO`): stop when asked, run to the end."""

    def stop(self, reason: str) -> None:
        """End the loop after the current iteration, saying why."""
        self.stop_reason = reason

    def _ask_method(self) -> None:
        """Stop before the next iteration when the method declines it (a spent privacy budget)."""
        if not self.done:
            why = self.method.declines(self, self.iteration + 1)
            if why is not None:
                self.stop(why)

    def _started(self):
        """The end of ``start``: stop at once if the method declines the first iteration, tell the
        callbacks."""
        self._ask_method()
        for callback in self.callbacks:
            callback.on_start(self)
        return self

    def finish(self) -> BOResult:
        """Tell the callbacks, close the method, return the result."""
        for callback in self.callbacks:
            callback.on_end(self)
        self.method.close()
        return self._result()

    def run(self) -> BOResult:
        """``start``, ``step`` until done, ``finish``."""
        self.start()
        try:
            while not self.done:
                self.step()
        except BaseException:
            self.method.close()
            raise
        return self.finish()


class BOLoop(_Driven):
    """``owners`` (a list of :class:`~fedgp.bo.Owner`, same input width) optimised by ``method`` for
    ``iterations`` iterations after ``initial`` starting points each; ``callbacks``: as
    :mod:`fedgp.bo.callbacks` (a :class:`~fedgp.bo.Budget`, :class:`~fedgp.bo.BOProgress`, your own
    or a function ``f(loop)``)."""

    def __init__(
        self,
        owners: Sequence[Owner],
        method: Method,
        iterations: int,
        *,
        initial: int = 3,
        seed: int = 0,
        callbacks: Iterable[BOCallback | Callable[[Any], Any]] = (),
    ):
        owners = list(owners) if isinstance(owners, Iterable) else owners
        if not isinstance(owners, list) or not owners or not all(isinstance(o, Owner) for o in owners):
            raise InputTypeError("owners must be a non-empty list of fedgp.bo.Owner")
        ids = [o.id for o in owners]
        if len(set(map(repr, ids))) != len(ids):
            raise InputError(f"owner ids must be distinct, got {ids}")
        dims = {o.dim for o in owners}
        if len(dims) != 1:
            raise InputError(
                f"every owner must search the same number of inputs (one shared model), got {dims}"
            )
        if not isinstance(method, Method):
            raise InputTypeError(f"method must be a fedgp.bo.Method (e.g. FederatedBO(...)), got {method!r}")
        for name, value, low in (("iterations", iterations, 1), ("initial", initial, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError(f"{name} must be an int >= {low}, got {value!r}")
        self.owners, self.method, self.iterations = owners, method, iterations
        self.initial, self.seed = initial, int(seed)
        self.callbacks = [as_bo_callback(c) for c in callbacks]
        self.iteration = 0
        self.history: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.started = False

    def start(self) -> BOLoop:
        """Evaluate the owners' starting points, start the method and the callbacks; or, when a
        callback restores a checkpoint (:class:`~fedgp.bo.BOCheckpoint`), take up where it was."""
        if not any([callback.restore(self) for callback in self.callbacks]):
            for k, owner in enumerate(self.owners):
                missing = self.initial - len(owner.y)
                if missing > 0:
                    owner.evaluate(uniform_points(owner.bounds, missing, self.seed, "bo initial", k))
            began = time.perf_counter()
            extra = self.method.start(self)
            self._record(0, extra, 0.0, time.perf_counter() - began)
        self.started = True
        return self._started()

    @property
    def done(self) -> bool:
        """Whether the iterations are spent or a callback stopped the loop."""
        return self.iteration >= self.iterations or self.stop_reason is not None

    def step(self) -> list[dict[str, Any]]:
        """One iteration: propose, evaluate, update; its history rows."""
        if not self.started:
            raise InputError("BOLoop.step: call start() first")
        if self.done:
            raise InputError(f"BOLoop.step: the loop is done ({self.stop_reason or 'every iteration ran'})")
        it = self.iteration + 1
        began = time.perf_counter()
        proposals = self.method.propose(self, it)
        if len(proposals) != len(self.owners):
            raise InputError(
                f"{self.method.name}: proposed {len(proposals)} points for {len(self.owners)} owners"
            )
        proposed = time.perf_counter()
        for owner, X in zip(self.owners, proposals):
            owner.evaluate(X)
        evaluated = time.perf_counter()
        extra = self.method.update(self, it)
        rows = self._record(it, extra, proposed - began, time.perf_counter() - evaluated)
        self.iteration = it
        self._ask_method()
        for callback in self.callbacks:
            callback.on_iteration(self, rows)
        return rows

    def _record(self, it: int, extra: dict[str, Any], propose: float, update: float) -> list[dict[str, Any]]:
        rows = [
            {
                "iteration": it,
                "owner": owner.id,
                "method": self.method.name,
                "evaluations": len(owner.y),
                "y": float(owner.y[-1]),
                "best_observed": owner.best_observed(),
                "regret": owner.regret(),
                "seconds_propose": propose,
                "seconds_update": update,
                **extra,
            }
            for owner in self.owners
        ]
        self.history.extend(rows)
        return rows

    def _result(self) -> BOResult:
        return BOResult(pd.DataFrame(self.history), self.owners, self.method, self.stop_reason)
