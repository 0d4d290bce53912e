"""``Method``: what a BO method does in the loop — propose a point per owner, learn from the answers.

:class:`~fedgp.bo.loop.BOLoop` owns the owners, their evaluations, the history and the callbacks;
a method only decides where each owner evaluates next (:meth:`Method.propose`) and what it learns
once the answers are in (:meth:`Method.update`). Federated BO, local BO, FTS and random search are
four methods in one harness, so they are compared on the same owners, starting points and seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from fedgp.errors import InputError

__all__ = ["Method", "LoopView"]


class LoopView(Protocol):
    """What a method reads of the loop that runs it (a :class:`~fedgp.bo.loop.BOLoop`): the owners,
    in order, the loop's seed and its planned iterations. Named here so that the method layer does
    not import the loop's."""

    owners: Sequence[Any]
    seed: int
    iterations: int


class Method:
    """Subclass and override :meth:`propose` (and :meth:`start`, :meth:`update` where the method
    learns). ``name`` labels the method's rows in the history."""

    name: str = "method"

    def start(self, loop: LoopView) -> dict[str, Any]:
        """After the owners' first evaluations, before iteration 1; returns extra history columns."""
        return {}

    def propose(self, loop: LoopView, iteration: int) -> list[torch.Tensor]:
        """One ``1 x d`` point per owner (in ``loop.owners`` order) to evaluate at ``iteration``."""
        raise NotImplementedError

    def update(self, loop: LoopView, iteration: int) -> dict[str, Any]:
        """After the owners evaluated ``iteration``'s points; returns extra history columns."""
        return {}

    def declines(self, loop: LoopView, iteration: int) -> str | None:
        """Why the method cannot run ``iteration`` (e.g. a spent privacy budget): the loop stops
        before it with this reason. ``None`` (the default): it can."""
        return None

    #: True for a method that keeps nothing between iterations but what the owners' rows say (it
    #: resumes from a checkpoint with no state of its own).
    stateless: bool = False

    def checkpoint(self, folder: Path, key: bytes | str | None = None) -> None:
        """Write what the method needs to go on into ``folder`` (:class:`~fedgp.bo.BOCheckpoint`);
        nothing by default."""

    def resume(self, loop: LoopView, iteration: int, folder: Path, key: bytes | str | None = None) -> None:
        """Take up after ``iteration`` from ``folder``, the owners' rows already restored: a stateless
        method has nothing to do; any other must say how (refused by default)."""
        if not self.stateless:
            raise InputError(f"{type(self).__name__} does not resume from a BO checkpoint")

    def close(self) -> None:
        """Release what the method holds (an engine): the loop calls it when it ends."""
