"""Assigners: which cluster(s) a client updates."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from fedgp.errors import InputError
from fedgp.messages import Configurable
from fedgp.models.state import HyperState
from fedgp.strategies.base import ClientOps
from fedgp.strategies.clustered.state import ClosedForm

__all__ = ["Assigner", "HardAssigner", "SoftAssigner", "FixedAssigner", "client_nll"]


def client_nll(ops: ClientOps, states: HyperState, form: ClosedForm) -> torch.Tensor:
    """Per-point NLL of every client under every state of ``states`` (batch ``(B, *E)``)."""
    if not form.closed:
        return ops.nll(states)
    model = form.model
    return model.nll(ops.clients, model.vector(states), model.noise(states))


class Assigner(Configurable, ABC):
    """Chooses among the k candidate states a client is sent. Returns per-point NLLs ``(B, R, k)``,
    responsibilities ``(B, R, k)`` (``None`` for hard assignment) and the hard choice ``(B, R)``."""

    #: whether clients receive all k candidates (else only their own cluster's state)
    needs_candidates = True

    @abstractmethod
    def assign(
        self, ops: ClientOps, candidates: HyperState, form: ClosedForm
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Per-point NLLs of the clients under each candidate ``(B, R, k)``, soft responsibilities (or
        ``None``), and the chosen cluster ``(B, R)``."""


@dataclass(frozen=True)
class HardAssigner(Assigner):
    """The cluster with the lowest per-point NLL of the client's data (highest marginal likelihood);
    ties go to the lowest index. ``criterion="sse"`` uses the squared error ``‖y − Φθ_j‖²`` instead
    (Su–Xu–Yang's rule (8); needs a linear mean) — the same choice for a noise-only GP whose k
    components share σ²."""

    criterion: str = "nll"

    def __post_init__(self) -> None:
        if self.criterion not in ("nll", "sse"):
            raise InputError(f"criterion must be 'nll' or 'sse', got {self.criterion!r}")

    def assign(self, ops, candidates, form) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Each client picks the candidate with the lowest NLL (or squared error)."""
        nll = client_nll(ops, candidates, form)
        if self.criterion == "nll":
            return nll, None, nll.argmin(dim=-1)
        model = form.model
        if model is None:
            raise InputError("HardAssigner(criterion='sse') needs a mean linear in its parameters")
        sse = model.sse(ops.clients, model.vector(candidates))
        return nll, None, sse.argmin(dim=-1)


@dataclass(frozen=True)
class SoftAssigner(Assigner):
    """Responsibilities ``λ_ij ∝ p(y_i | θ_j)^(1/temperature)`` (uniform prior over clusters).

    Each client then updates every cluster, and the server weighs client i's change of cluster j by
    λ_ij — for one gradient step exactly gradient descent on ``Σ_j λ_ij F_i(θ_j)`` (the soft
    clustering of Li, Lu & Vaikuntanathan's formulation, Su–Xu–Yang's eq. 7 with soft λ).
    """

    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise InputError("temperature must be > 0")

    def assign(self, ops, candidates, form) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Responsibilities ∝ exp(−n·NLL / temperature) over the candidates; the argmin as the choice."""
        nll = client_nll(ops, candidates, form)
        sizes = ops.sizes.to(nll.dtype).reshape(-1, *([1] * (nll.dim() - 1)))
        resp = torch.softmax(-sizes * nll / self.temperature, dim=-1)
        return nll, resp, nll.argmin(dim=-1)


@dataclass(frozen=True)
class FixedAssigner(Assigner):
    """Labels that never change: given ``labels`` (one per client, in federation order), or those
    the initialiser set (one-shot clustering). The server sends each client only its own cluster's
    state and label; the labels themselves stay on the server (:meth:`ClusteredGP.client_view`)."""

    labels: tuple[int, ...] | None = None
    needs_candidates = False

    def assign(self, ops, candidates, form) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Never called: with fixed labels the server sends each client only its cluster's state."""
        raise InputError("FixedAssigner does not choose: the server sends each client its cluster's state")
