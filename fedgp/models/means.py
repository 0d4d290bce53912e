"""Means linear in their parameters beyond GPyTorch's own: a weighted sum of Gaussian bumps."""

from __future__ import annotations

import gpytorch
import torch

from fedgp.errors import InputError

__all__ = ["GaussianBumpMean"]


class GaussianBumpMean(gpytorch.means.Mean):
    """``m(x) = Σ_j w_j exp(−‖x − c_j‖² / (2 s²))``: fixed centres ``c_j`` and width ``s``, trained
    weights ``w`` (shape ``(F, 1)``, like ``LinearMean``'s).

    Linear in ``w`` (so the clustered-regression closed forms and ``LabelFlip`` apply), and with
    more bumps than a client has points a client cannot identify ``w`` alone: the setting in which
    learning from the right other clients pays (Werner et al.'s §4.1, in GP form).
    """

    def __init__(self, centres: torch.Tensor, width: float, batch_shape: tuple[int, ...] = ()):
        super().__init__()
        centres = torch.as_tensor(centres, dtype=torch.get_default_dtype())
        if centres.dim() == 1:
            centres = centres.unsqueeze(-1)
        if centres.dim() != 2 or not width > 0:
            raise InputError(
                f"GaussianBumpMean: centres must be (F,) or (F, d) and width > 0; "
                f"got centres {tuple(centres.shape)}, width {width}"
            )
        self.register_buffer("centres", centres)
        self.width = float(width)
        self.register_parameter("weights", torch.nn.Parameter(torch.zeros(*batch_shape, len(centres), 1)))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """φ(x): ``(..., n, F)``."""
        d2 = ((x.unsqueeze(-2) - self.centres.to(x.dtype)) ** 2).sum(-1)
        return torch.exp(-d2 / (2 * self.width**2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).matmul(self.weights).squeeze(-1)
