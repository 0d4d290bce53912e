"""``HyperState``: named hyper-parameter values, the server's and the clients' unit of exchange.

A state maps GPyTorch-style dotted names (``"covar_module.base_kernel.lengthscale"``) to values
in *constrained* units, the units a user reads and sets with ``Module.initialize``. A state may be
batched: every value then carries the same leading ``batch_shape`` (one state per client, per
cluster, per restart...). The event shape of each entry (the shape of the parameter itself) is
stored so that batching is unambiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from fedgp.errors import InputError

__all__ = ["HyperState"]


class HyperState(dict):
    """Named hyper-parameter values with an optional common batch shape.

    A read-only ``dict`` (name → tensor): reading a value, iterating and ``len`` are the built-in
    dict's, with no Python call in between — states are read in every local step of every client.
    Writing is refused; :meth:`map` and friends make new states."""

    __slots__ = ("_events",)

    def __init__(self, values: Mapping[str, torch.Tensor], event_shapes: Mapping[str, Sequence[int]]):
        if set(values) != set(event_shapes):
            raise InputError(f"values {sorted(values)} and event shapes {sorted(event_shapes)} differ")
        super().__init__((k, torch.as_tensor(v)) for k, v in values.items())
        self._events = {k: torch.Size(event_shapes[k]) for k in values}
        batch = None
        for name, value in dict.items(self):
            event = self._events[name]
            if tuple(value.shape[value.dim() - len(event) :]) != tuple(event):
                raise InputError(f"{name}: shape {tuple(value.shape)} does not end in {tuple(event)}")
            this = value.shape[: value.dim() - len(event)]
            if batch is not None and this != batch:
                raise InputError(f"{name}: batch shape {tuple(this)} differs from {tuple(batch)}")
            batch = this

    # -- read-only ------------------------------------------------------------------------------
    def _read_only(self, *args, **kwargs) -> None:
        raise TypeError(
            "a HyperState is read-only: make a new one (state.map(...), HyperState({...}, shapes))"
        )

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore[assignment]

    def __reduce__(self):
        return (HyperState, (dict(self), self._events))

    def __eq__(self, other) -> bool:
        """Same names, event shapes and values (element-wise equal tensors)."""
        if not isinstance(other, Mapping) or set(self) != set(other):
            return False
        return all(torch.equal(v, torch.as_tensor(other[k])) for k, v in self.items())

    __hash__ = None  # type: ignore[assignment]

    @property
    def event_shapes(self) -> dict[str, torch.Size]:
        """Each hyper-parameter's own shape; the rest of a value's shape is the batch."""
        return dict(self._events)

    @property
    def batch_shape(self) -> torch.Size:
        """The leading dimensions shared by every value: ``()`` for one state, ``(k,)`` for k clusters, ..."""
        name = next(iter(self))
        value = self[name]
        return value.shape[: value.dim() - len(self._events[name])]

    # -- functional helpers -----------------------------------------------------------------------
    def map(self, fn: Callable[[torch.Tensor, int], torch.Tensor]) -> HyperState:
        """Apply ``fn(value, event_ndim)`` to every entry (batch dims lead)."""
        return HyperState({k: fn(v, len(self._events[k])) for k, v in self.items()}, self._events)

    def index(self, idx) -> HyperState:
        """Index the leading batch dimension(s): ``state.index(3)``, ``state.index(mask)``."""
        return self.map(lambda v, _: v[idx])

    def expand(self, *batch_shape: int) -> HyperState:
        """Prepend batch dimensions (the values are shared, not copied)."""
        shape = torch.Size(batch_shape)
        return self.map(lambda v, e: v.expand(*shape, *v.shape))

    def gather(self, choice: torch.Tensor) -> HyperState:
        """Pick along the last batch dimension: batch ``(*B, k)`` with ``choice`` of shape ``B``."""

        def pick(v: torch.Tensor, e: int) -> torch.Tensor:
            lead = choice.dim()
            idx = choice.reshape(*choice.shape, 1, *([1] * e)).expand(*choice.shape, 1, *v.shape[lead + 1 :])
            return torch.gather(v, lead, idx).squeeze(lead)

        return self.map(pick)

    def clone(self) -> HyperState:
        """A detached copy of every value."""
        return self.map(lambda v, _: v.detach().clone())

    def weighted_mean(self, weights: torch.Tensor) -> HyperState:
        """``sum_b w_b state_b`` over the first batch dimension (weights need not sum to one)."""
        # In the states' own precision (a float32 spec's server averages in float32 on every engine).
        return self.map(lambda v, e: torch.tensordot(weights.to(v.dtype), v, dims=([0], [0])))

    @staticmethod
    def stack(states: Sequence[HyperState], dim: int = 0) -> HyperState:
        """Stack states along a new batch dimension ``dim``."""
        first = states[0]
        return HyperState({k: torch.stack([s[k] for s in states], dim) for k in first}, first.event_shapes)

    @staticmethod
    def cat(states: Sequence[HyperState]) -> HyperState:
        """Concatenate states along their first batch dimension."""
        first = states[0]
        return HyperState({k: torch.cat([s[k] for s in states], 0) for k in first}, first.event_shapes)

    def allclose(self, other: HyperState, rtol: float = 1e-8, atol: float = 0.0) -> bool:
        """Whether ``other`` has the same names and values within ``rtol``/``atol`` (``torch.allclose``)."""
        return set(self) == set(other) and all(
            torch.allclose(self[k], other[k], rtol=rtol, atol=atol) for k in self
        )

    def max_relative_difference(self, other: HyperState) -> float:
        """The largest ``|self − other| / |other|`` over every entry of every value."""
        return max(float(((self[k] - other[k]).abs() / other[k].abs().clamp_min(1e-300)).max()) for k in self)

    def to_dict(self) -> dict[str, float]:
        """Flat ``{"name" or "name[i]": float}`` of an unbatched state (for tables and logs)."""
        if self.batch_shape:
            raise InputError(
                f"to_dict needs an unbatched state, this one has batch {tuple(self.batch_shape)}"
            )
        out: dict[str, float] = {}
        for name, value in self.items():
            flat = value.detach().reshape(-1)
            if flat.numel() == 1:
                out[name] = float(flat[0])
            else:
                out.update({f"{name}[{i}]": float(x) for i, x in enumerate(flat)})
        return out

    def __repr__(self) -> str:
        batch = f", batch_shape={tuple(self.batch_shape)}" if self.batch_shape else ""
        if self.batch_shape:
            body = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self.items())
        else:
            body = ", ".join(f"{k}={_short(v)}" for k, v in self.items())
        return f"HyperState({body}{batch})"


def _short(value: torch.Tensor) -> str:
    flat = value.detach().reshape(-1)
    if flat.numel() == 1:
        return f"{float(flat[0]):.4g}"
    return "[" + ", ".join(f"{float(x):.4g}" for x in flat[:6]) + (", ...]" if flat.numel() > 6 else "]")
