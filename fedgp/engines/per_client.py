"""The batched engine's fallback: one GPyTorch model per client in turn, for a spec the tensor path
cannot evaluate (:func:`fedgp.engines.batched.batched_path_reason` says why). It computes exactly
what the sequential engine computes, inside a batched engine's chunks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedgp.data.client import ClientData
from fedgp.engines.cpus import torch_on_tile_threads
from fedgp.engines.sequential import SequentialOps
from fedgp.models.posterior import Prediction, condition_client
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.base import TrainResult
from fedgp.strategies.local import LocalTraining

__all__ = ["PerClientOps", "predict_alone"]


class PerClientOps:
    """:class:`~fedgp.strategies.base.ClientOps` for a chunk, one GPyTorch model per client in turn:
    the batched engine's fallback for specs its tensor path cannot evaluate (it computes exactly
    what the sequential engine computes)."""

    def __init__(
        self, spec: GPSpec, model, clients: Sequence[ClientData], keys: torch.Tensor, rnd: int, seed: int
    ):
        """``clients`` with their ``keys``, evaluated one after another with the reusable GPyTorch
        ``model`` of ``spec``, in round ``rnd`` of a run with master ``seed``."""
        self.spec, self.round, self.seed = spec, rnd, seed
        self.clients, self.indices = list(clients), keys
        self.sizes = torch.tensor([c.n for c in self.clients], dtype=torch.long)
        self._ops = [
            SequentialOps(spec, model, c, int(k), rnd, seed) for c, k in zip(self.clients, keys.tolist())
        ]

    def _each(self, states: HyperState):
        for i, ops in enumerate(self._ops):
            yield ops, states.index(slice(i, i + 1))

    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point exact NLL, client by client with GPyTorch (the fallback path)."""
        return torch.cat([ops.nll(s) for ops, s in self._each(states)])

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and gradient, client by client with GPyTorch (the fallback path)."""
        out = [ops.gradient(s, batch_size) for ops, s in self._each(states)]
        return torch.cat([loss for loss, _ in out]), HyperState.cat([g for _, g in out])

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Local training, client by client with GPyTorch (the fallback path)."""
        out = [ops.train(s, local) for ops, s in self._each(states)]
        return TrainResult(
            HyperState.cat([r.states for r in out]),
            torch.cat([r.loss for r in out]),
            torch.cat([r.steps for r in out]),
        )

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """Personalised predictions, client by client with GPyTorch (the fallback path)."""
        return [p for ops, s in self._each(states) for p in ops.predict(s, X_new, full_cov)]


def predict_alone(
    spec: GPSpec,
    states: HyperState,
    positions: Sequence[int],
    clients: Sequence[ClientData],
    X_new: torch.Tensor | None,
    full_cov: bool,
) -> list[tuple[int, Prediction]]:
    """``(position, posterior)`` of each client by itself (at ``X_new`` or its test inputs), conditioning
    ``states.index(position)`` on its data (:func:`~fedgp.models.posterior.condition_client`), with torch
    on every thread the engine may use: what the batched engine does with a large client, whose
    posterior is one BLAS-bound computation (:mod:`fedgp.models.large`)."""
    with torch_on_tile_threads():
        return [
            (p, condition_client(spec, states.index(p), c, X_new, full_cov))
            for p, c in zip(positions, clients)
        ]
