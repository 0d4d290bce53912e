"""``Roster``: what the server learns when the clients register (the ``hello`` exchange)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedgp.errors import UnknownClientError

__all__ = ["Roster"]


@dataclass(frozen=True)
class Roster:
    """Each registered client's id, training size, test size and input dimension, in registry order.
    A client's position here is its key: the integer its random streams are keyed by."""

    ids: list[Any]
    sizes: torch.Tensor
    n_test: torch.Tensor
    dims: torch.Tensor

    def position(self, client_id: Any) -> int:
        """The position of the client with this id; an unknown id is an :class:`UnknownClientError`."""
        try:
            return self.ids.index(client_id)
        except ValueError:
            raise UnknownClientError(f"no client with id {client_id!r}") from None

    def __len__(self) -> int:
        return len(self.ids)
