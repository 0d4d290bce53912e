"""``RandomSearch``: every owner evaluates a uniform point of its box — the floor every method must beat."""

from __future__ import annotations

from fedgp.bo.loop import uniform_points
from fedgp.bo.method import Method

__all__ = ["RandomSearch"]


class RandomSearch(Method):
    """Uniform points, drawn from ``(seed, owner, iteration)``."""

    name = "random"
    stateless = True

    def propose(self, loop, iteration: int) -> list:
        return [
            uniform_points(o.bounds, 1, loop.seed, "bo random", k, iteration)
            for k, o in enumerate(loop.owners)
        ]
