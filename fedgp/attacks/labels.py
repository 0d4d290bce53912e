"""Label flipping: attacked clients train on ``−y`` — a data attack, carried out by the client.

The attacked clients learn their role from the training task's options (``label_flip``: their
registry positions), like ``simulate_failures``, so every engine runs it the same way. The engines
hold each client's data in their own layout, so instead of rewriting it the client evaluates the
*same objective* through an identity: for a mean that is linear in its parameters (``LinearMean``,
``ConstantMean``, ``ZeroMean``) ``m(x; −w) = −m(x; w)``, hence

    −log p(−y | X; w, κ) = −log p(y | X; −w, κ)

(the kernel and noise parameters κ see only the quadratic form, unchanged by the sign). So a
flipped client's NLL, gradient, training run and prediction are the engine's at the negated mean
parameters, mapped back: exact, step for step (Adam and SGD commute with the sign). Closed forms
that read the data directly get clients with ``−y``. With a zero mean the attack changes nothing
at all — the GP marginal likelihood cannot tell ``y`` from ``−y``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import gpytorch
import torch

from fedgp.attacks.base import Attack
from fedgp.errors import InputError
from fedgp.models.linear import linear_model
from fedgp.strategies.base import ClientOps, TrainResult

__all__ = ["LabelFlip", "flipped_ops", "OPTION"]

#: The task option that names the attacked clients (comma-separated registry positions).
OPTION = "label_flip"


@dataclass(frozen=True)
class LabelFlip(Attack):
    """Attacked clients replace their targets by ``−y`` for training (a data attack)."""

    forges = False

    def task_options(self, attackers) -> dict[str, Any]:
        return {OPTION: ",".join(str(int(p)) for p in attackers.tolist())}


def _mean_names(spec, client) -> list[str]:
    """The mean parameters to negate; ``ValueError`` if the mean is not odd in its parameters
    (checked on the client's own inputs)."""
    if isinstance(spec.mean, gpytorch.means.ZeroMean):
        return []
    try:
        model = linear_model(spec)
        model.features(client.X, client)
        return list(model.names)
    except ValueError as err:
        raise InputError(
            f"LabelFlip needs a mean linear in its parameters (or ZeroMean), so that training on −y is "
            f"training at the negated mean parameters: {err}"
        ) from None


class _FlippedOps:
    """``ClientOps`` of a batch in which the clients at ``flip`` train on ``−y``."""

    def __init__(self, ops, flip: torch.Tensor):
        self._ops, self._flip = ops, flip
        self.spec, self.indices, self.sizes = ops.spec, ops.indices, ops.sizes
        self.round, self.seed = ops.round, ops.seed
        self.clients = [replace(c, y=-c.y) if f else c for c, f in zip(ops.clients, flip.tolist())]
        self._names = _mean_names(ops.spec, ops.clients[0])

    def _negate(self, states):
        def neg(value, name):
            if name not in self._names:
                return value
            sign = torch.where(self._flip, -1.0, 1.0).to(value.dtype)
            return value * sign.reshape(-1, *([1] * (value.dim() - 1)))

        return type(states)({k: neg(v, k) for k, v in states.items()}, states.event_shapes)

    def nll(self, states):
        return self._ops.nll(self._negate(states))

    def gradient(self, states, batch_size=None):
        loss, grads = self._ops.gradient(self._negate(states), batch_size)
        return loss, self._negate(grads)  # d/dw f(−w) = −f'(−w): the mean gradients change sign

    def train(self, states, local):
        out = self._ops.train(self._negate(states), local)
        return TrainResult(self._negate(out.states), out.loss, out.steps)

    def predict(self, states, X_new=None, full_cov=False):
        preds = self._ops.predict(self._negate(states), X_new, full_cov)
        return [replace(p, mean=-p.mean) if f else p for p, f in zip(preds, self._flip.tolist())]


def flipped_ops(ops, task) -> ClientOps:
    """``ops`` as the client sees them in this task: flipped for the clients the options name."""
    named = task.options.get(OPTION)
    if not named:
        return ops
    attacked = torch.tensor([int(x) for x in str(named).split(",")], dtype=torch.long)
    flip = torch.isin(ops.indices, attacked)
    return _FlippedOps(ops, flip) if bool(flip.any()) else ops
