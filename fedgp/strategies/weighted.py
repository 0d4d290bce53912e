"""FGPR with the first client's aggregation weight forced: the FGPR paper's Fig. 9 ablation.

In the multi-fidelity federation of Yue & Kontar §5 the first client holds the high-fidelity (HF)
data; its weight p₁ in FedAvg decides how much the low-fidelity clients pull the shared prior.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fedgp.errors import InputError
from fedgp.messages import RoundPlan
from fedgp.strategies.fgpr import FGPR

__all__ = ["WeightedFGPR"]


@dataclass(frozen=True)
class WeightedFGPR(FGPR):
    """FGPR with the first (HF) client's aggregation weight set to ``hf_weight``.

    The other clients share ``1 - hf_weight`` in proportion to their sizes. This is the paper's
    Fig. 9 ablation; with ``hf_weight = N_1 / N`` it is plain FGPR, with ``hf_weight = 1`` the HF
    client trained alone. Full participation only (the forced weight is the first client's).
    """

    hf_weight: float = field(default=1.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.hf_weight <= 1.0:
            raise InputError(f"hf_weight must be in [0, 1], got {self.hf_weight}")
        if self.clients_per_round is not None:
            raise InputError("WeightedFGPR supports full participation only (clients_per_round=None)")

    def configure(self, rnd, server, ctx, rng) -> RoundPlan:
        plan = super().configure(rnd, server, ctx, rng)
        rest = ctx.weights[1:]
        weights = torch.cat(
            [torch.tensor([self.hf_weight], dtype=torch.float64), (1 - self.hf_weight) * rest / rest.sum()]
        )
        return replace(plan, weights=weights[plan.participants])
