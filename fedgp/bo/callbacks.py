"""What happens around the iterations of a BO loop: progress, stopping on a budget, your own code.

:class:`~fedgp.bo.loop.BOLoop` calls every callback's :meth:`BOCallback.on_start` after the owners'
first evaluations, :meth:`BOCallback.on_iteration` after each iteration with its history rows (one
per owner), and :meth:`BOCallback.on_end`. A plain function ``f(loop)`` is called after each
iteration. ``loop.stop(reason)`` ends the loop after the current iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedgp.errors import InputError, InputTypeError
from fedgp.run.progress import progress_bar

__all__ = ["BOCallback", "BOProgress", "Budget", "as_bo_callback"]


class BOCallback:
    """Override the moments you need; each gets the loop (``loop.owners``, ``loop.iteration``,
    ``loop.history``, ``loop.stop(reason)``)."""

    def restore(self, loop) -> bool:
        """Before the start: put back a state written earlier (:class:`~fedgp.bo.BOCheckpoint`);
        ``True`` when the loop resumes from it, then its starting points are not evaluated again."""
        return False

    def on_start(self, loop) -> None:
        """After the owners' first evaluations."""

    def on_iteration(self, loop, rows: list[dict[str, Any]]) -> None:
        """After iteration ``loop.iteration``; ``rows`` are its history rows, one per owner."""

    def on_end(self, loop) -> None:
        """After the last iteration."""


@dataclass
class _Function(BOCallback):
    function: Callable[[Any], Any]

    def on_iteration(self, loop, rows) -> None:
        self.function(loop)


def as_bo_callback(given: BOCallback | Callable[[Any], Any]) -> BOCallback:
    """``given`` as a callback (a function ``f(loop)`` runs after every iteration)."""
    if isinstance(given, BOCallback):
        return given
    if callable(given):
        return _Function(given)
    raise InputTypeError(f"a BO callback must be a fedgp.bo.BOCallback or a function f(loop), got {given!r}")


@dataclass
class BOProgress(BOCallback):
    """A progress bar over iterations (``show``: as :class:`fedgp.run.Progress`), showing the owners'
    mean best value."""

    show: bool | None = None

    def on_start(self, loop) -> None:
        self._bar = progress_bar(progress=self.show, desc=loop.method.name, total=loop.iterations)

    def on_iteration(self, loop, rows) -> None:
        best = sum(r["best_observed"] for r in rows) / len(rows)
        self._bar.set_postfix(mean_best=f"{best:.4g}", refresh=False)
        self._bar.update(1)

    def on_end(self, loop) -> None:
        self._bar.close()


@dataclass
class Budget(BOCallback):
    """Stop once every owner has made ``evaluations`` evaluations, or after ``seconds`` of wall time
    since the start (either may be ``None``)."""

    evaluations: int | None = None
    seconds: float | None = None
    _began: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.evaluations is None and self.seconds is None:
            raise InputError("Budget needs evaluations=..., seconds=... or both")
        if self.evaluations is not None and (
            isinstance(self.evaluations, bool)
            or not isinstance(self.evaluations, int)
            or self.evaluations < 1
        ):
            raise InputError(f"Budget(evaluations=...) must be an int >= 1, got {self.evaluations!r}")
        if self.seconds is not None and not float(self.seconds) > 0:
            raise InputError(f"Budget(seconds=...) must be > 0, got {self.seconds!r}")

    def on_start(self, loop) -> None:
        self._began = time.perf_counter()

    def on_iteration(self, loop, rows) -> None:
        if self.evaluations is not None and min(len(o.y) for o in loop.owners) >= self.evaluations:
            loop.stop(f"every owner made {self.evaluations} evaluations")
        elif self.seconds is not None and time.perf_counter() - self._began >= self.seconds:
            loop.stop(f"{self.seconds} s of wall time spent")
