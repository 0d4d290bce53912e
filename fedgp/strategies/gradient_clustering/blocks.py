"""Parameter blocks: which trained hyper-parameters are compared with each other when clustering.

Distances are Euclidean over a block's flattened raw gradient, so a block with large gradients
(often the mean weights) would dominate one with small ones (raw lengthscale, noise). Clustering
each block separately keeps eq. 24 unchanged inside each (digest §6.2, option (i)); each block then
has its own cluster membership, which the algorithm allows.

``blocks``: ``"separate"`` (the mean parameters, and every other trained hyper-parameter, as two
blocks; the default), ``"mean"`` (only the mean parameters are trained: fix the rest in the
``GPSpec``), ``"joint"`` (one block of everything), or a tuple of blocks, each a tuple of name
prefixes (``(("mean_module.",), ("covar_module.", "likelihood."))`` is ``"separate"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.errors import InputError
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["Blocks", "resolve_blocks", "check_blocks"]

PRESETS = {
    "separate": (("mean_module.",), ("",)),
    "mean": (("mean_module.",),),
    "joint": (("",),),
}


def check_blocks(blocks) -> None:
    """Refuse a ``blocks`` setting that is neither a preset name nor a non-empty tuple of non-empty tuples of
    parameter-name prefixes."""
    if isinstance(blocks, str):
        if blocks not in PRESETS:
            raise InputError(
                f"blocks must be one of {sorted(PRESETS)} or a tuple of prefix tuples, got {blocks!r}"
            )
        return
    if not isinstance(blocks, (tuple, list)) or not blocks:
        raise InputError(
            f"blocks must be a preset name or a non-empty tuple of prefix tuples, got {blocks!r}"
        )
    for block in blocks:
        if not isinstance(block, (tuple, list)) or not block or not all(isinstance(p, str) for p in block):
            raise InputError(f"each block must be a non-empty tuple of name prefixes, got {block!r}")


@dataclass(frozen=True)
class Blocks:
    """The trained hyper-parameters flattened into one raw vector of length D, cut into blocks."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    columns: tuple[torch.Tensor, ...]  # per block, its columns of the flat vector

    @property
    def width(self) -> int:
        """The number of scalars in the flattened block."""
        return sum(int(s.numel()) for s in self.shapes)

    def flatten(self, values: dict | HyperState, batch: tuple[int, ...], prefix: str = "") -> torch.Tensor:
        """``(*batch, D)`` from the entries ``prefix + name`` of ``values`` (batch ``batch``)."""
        return torch.cat(
            [values[prefix + n].reshape(*batch, -1).to(torch.float64) for n in self.names], dim=-1
        )

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named tensors from a flat ``(..., width)`` tensor."""
        batch = tuple(flat.shape[:-1])
        out, start = {}, 0
        for name, shape in zip(self.names, self.shapes):
            size = int(shape.numel())
            out[name] = flat[..., start : start + size].reshape(*batch, *shape)
            start += size
        return out


def resolve_blocks(spec: GPSpec, blocks) -> Blocks:
    """The blocks of ``spec``'s trained hyper-parameters; each belongs to the first block whose
    prefix it starts with. ``ValueError`` if one belongs to none, or nothing is trained."""
    check_blocks(blocks)
    prefixes = PRESETS[blocks] if isinstance(blocks, str) else blocks
    trained = [p for p in spec.params if p.trainable]
    if not trained:
        raise InputError("the GPSpec trains no hyper-parameter: there is nothing to cluster")
    member = {}
    for p in trained:
        for b, block in enumerate(prefixes):
            if any(p.name.startswith(prefix) for prefix in block):
                member[p.name] = b
                break
        else:
            hint = " (blocks='mean' clusters only the mean: fix the others with GPSpec(fixed=...))"
            raise InputError(
                f"hyper-parameter {p.name!r} is trained but in no block{hint if blocks == 'mean' else ''}"
            )
    names = tuple(p.name for p in trained)
    shapes = tuple(torch.Size(p.shape) for p in trained)
    offsets, start = {}, 0
    for p in trained:
        offsets[p.name] = torch.arange(start, start + int(torch.Size(p.shape).numel()))
        start += int(torch.Size(p.shape).numel())
    columns = []
    for b in range(len(prefixes)):
        cols = [offsets[n] for n in names if member[n] == b]
        if cols:
            columns.append(torch.cat(cols))
    return Blocks(names, shapes, tuple(columns))
