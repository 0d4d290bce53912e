"""Engines that return replies as they arrive, for a server that does not wait for a whole round.

An ordinary engine's :meth:`~fedgp.engines.base.Engine.run` delivers a task and waits for every
reply (or its timeout). A buffered asynchronous server measured on real machines
(``fedgp.strategies.Asynchronous(speeds="measured")``) must instead step as soon as a few replies
are in, whichever tasks they answer, while the other owners keep working. An engine that can do
this implements :class:`Arrivals`: :meth:`~Arrivals.dispatch` sends a task and returns at once,
:meth:`~Arrivals.arrivals` waits for the next replies of any task still in flight and says when
each arrived (the wall clock, seconds since the engine's first dispatch). Flower's grid does
(:class:`~fedgp.flower.grid_engine.GridEngine`: ``push_messages`` / ``pull_messages``); an engine
that runs its clients in this process has nothing that arrives late, so a simulated schedule
(``speeds=...``) replays one there instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from fedgp.messages import Field, Outcome, Task

__all__ = ["Arrivals"]


class Arrivals(ABC):
    """An engine that sends tasks without waiting and hands back replies as they arrive."""

    @abstractmethod
    def dispatch(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> dict[int, str]:
        """Send ``task`` to ``clients`` (ascending positions) and return without waiting: the
        clients it could not be sent to, with the reason (the others are now in flight)."""

    @abstractmethod
    def in_flight(self) -> torch.Tensor:
        """The clients (ascending positions) whose task this engine has sent and not yet answered:
        a job the server believes out but the engine does not hold (a run resumed from a
        checkpoint on a fresh engine) will never arrive."""

    @abstractmethod
    def arrivals(self, need: int, fields: Mapping[str, Field]) -> tuple[Outcome, torch.Tensor]:
        """Wait until the replies of at least ``need`` clients in flight have arrived (at least one
        look when ``need <= 0``), or none is in flight any more; return them (checked against
        ``fields``; a failed, late or malformed one is a failure with its reason) and, aligned
        with ``outcome.clients``, the seconds since the first dispatch at which each arrived."""
