"""Cluster aggregators: how the server turns one round's contributions into a cluster's next state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from fedgp.aggregators import StateAggregator, WeightedMean
from fedgp.checks import check_settings
from fedgp.errors import InputError
from fedgp.messages import Configurable
from fedgp.models.linear import LinearMeanModel
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.clustered.solve import check_units, step_sizes

__all__ = ["Contributions", "Aggregator", "ClusterAverage", "GlobalWeighted", "GradientStep"]


@dataclass(frozen=True)
class Contributions:
    """What cluster j of one restart receives in a round.

    State aggregators read the members' individual states (``values``), their responsibilities λ
    (ones for hard assignment) and sizes; gradient aggregators read only sums — the members'
    λ-weighted gradient sum and Σλ (the member count for hard assignment) — which clients send as
    summed fields, so no client's gradient reaches the server on its own.
    """

    values: HyperState | None
    members: torch.Tensor
    lam: torch.Tensor
    sizes: torch.Tensor
    total_size: float
    participants: int
    num_clients: int
    soft: bool
    gradient_sum: HyperState | None = None
    member_weight: float = 0.0


def _check_space(space: str) -> None:
    if space not in ("constrained", "raw"):
        raise InputError(f"average_space must be 'constrained' or 'raw', got {space!r}")


class Aggregator(Configurable, ABC):
    """How the server turns one round's :class:`Contributions` into a cluster's next state.

    A state aggregator averages the members' states; a gradient aggregator (``uses_gradients``) takes one
    step along the members' summed gradient, so no client's gradient reaches the server on its own.
    """

    uses_gradients = False

    @abstractmethod
    def combine(
        self, spec: GPSpec, old: HyperState, c: Contributions, model: LinearMeanModel | None
    ) -> HyperState:
        """The next state of one cluster."""


@dataclass(frozen=True)
class _MemberStates(Aggregator):
    """Aggregators over the members' states: a state ``aggregator``, by default the weighted mean
    in ``average_space``."""

    average_space: str = "constrained"
    aggregator: StateAggregator | None = None

    def __post_init__(self) -> None:
        _check_space(self.average_space)

    def _rule(self) -> StateAggregator:
        return self.aggregator if self.aggregator is not None else WeightedMean(self.average_space)

    def _weights(self, c: Contributions, base: torch.Tensor) -> torch.Tensor:
        return base * c.lam if c.soft else base


@dataclass(frozen=True)
class ClusterAverage(_MemberStates):
    """IFCA model averaging: the members' states combined by ``aggregator`` (default: their mean
    in ``average_space``, weighted by size when ``weighted``, else plain — the paper's formula); an
    empty cluster keeps its state. A robust aggregator (e.g. ``CoordinateMedian``) plugs in here."""

    weighted: bool = True

    def combine(self, spec, old, c, model) -> HyperState:
        if len(c.members) == 0:
            return old
        w = self._weights(c, c.sizes if self.weighted else torch.ones(len(c.members), dtype=torch.float64))
        if float(w.sum()) <= 0:
            return old
        return self._rule()(spec, c.values, w / w.sum(), old)


@dataclass(frozen=True)
class GlobalWeighted(_MemberStates):
    """Su–Xu–Yang's aggregation: ``θ_j ← Σ_i (n_i/N) θ_{ij}`` over all participants, where a client
    not in cluster j returns ``θ_j`` unchanged — so cluster j moves by ``N_j/N`` of its members'
    average change (Lemma 1). For k = 1 it is FedAvg. With an ``aggregator`` (e.g. a robust one)
    the members' states are first combined by it, and the cluster moves ``N_j/N`` of the way there."""

    def combine(self, spec, old, c, model) -> HyperState:
        if len(c.members) == 0:
            return old
        w = self._weights(c, c.sizes / c.total_size)
        mean = WeightedMean(self.average_space)
        if self.aggregator is None:
            states = type(old).cat([c.values, old.expand(1)])
            return mean(spec, states, torch.cat([w, (1.0 - w.sum()).reshape(1)]), old)
        target = self.aggregator(spec, c.values, w / w.sum(), old)
        share = w.sum()
        return mean(spec, HyperState.stack([target, old]), torch.stack([share, 1.0 - share]), old)


@dataclass(frozen=True)
class GradientStep(Aggregator):
    """IFCA gradient averaging: ``θ_j ← θ_j − (lr/m) Σ_{i∈S_j} g_i`` on raw values; ``m`` is all K
    clients (``"total"``, the paper), the round's participants, or the cluster's size (``"cluster"``).
    ``units="squared_loss"`` multiplies ``lr`` by the cluster's noise variance (see GradientDescent).
    It reads only the summed gradient of the cluster's members."""

    lr: float = 0.05
    normalization: str = "total"
    units: str = "nll"
    uses_gradients = True

    def __post_init__(self) -> None:
        check_units(self.units)
        check_settings(self, lr="positive")
        if self.normalization not in ("total", "participants", "cluster"):
            raise InputError(f"unknown gradient_normalization {self.normalization!r}")

    def combine(self, spec, old, c, model) -> HyperState:
        if c.member_weight <= 0:
            return old
        denom = {
            "total": c.num_clients,
            "participants": c.participants,
            "cluster": c.member_weight,
        }[self.normalization]
        lr = self.lr if self.units == "nll" else float(step_sizes(self.lr, self.units, model, old))
        old_raw = spec.to_raw(old)
        stepped = {}
        for p in spec.params:
            if not p.trainable:
                stepped[p.name] = old_raw[p.name]
                continue
            stepped[p.name] = old_raw[p.name] - (lr / denom) * c.gradient_sum[p.name]
        return spec.from_raw(HyperState(stepped, old_raw.event_shapes))
