"""One client's data, and an ordered federation of clients.

Data are checked where they enter: a bad array raises a ``ValueError`` that names the client,
the field and the problem, so a user with a thousand clients learns *which* one is broken.
Nothing is reshaped, dropped or imputed silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

__all__ = ["ClientData", "Federation"]

ArrayLike = Any  # numpy array, torch tensor, pandas object or nested sequence


def _as_float_tensor(value: ArrayLike, client: Any, name: str) -> torch.Tensor:
    if isinstance(value, (pd.DataFrame, pd.Series)):
        value = value.to_numpy()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
    else:
        array = np.asarray(value)
        if array.dtype == object:
            raise ValueError(f"client {client!r}: {name} has dtype object; expected real numbers")
        tensor = torch.from_numpy(np.array(array, copy=True))
    if (
        tensor.dtype == torch.bool
        or tensor.is_complex()
        or not (
            tensor.is_floating_point()
            or tensor.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
        )
    ):
        raise ValueError(f"client {client!r}: {name} has dtype {tensor.dtype}; expected real numbers")
    return tensor.to(torch.float64).contiguous()


def _check_finite(tensor: torch.Tensor, client: Any, name: str) -> None:
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        rows = torch.nonzero(bad.reshape(tensor.shape[0], -1).any(dim=1)).flatten()
        kind = "NaN" if bool(torch.isnan(tensor).any()) else "inf"
        raise ValueError(
            f"client {client!r}: {name} contains {int(bad.sum())} non-finite value(s) ({kind}), "
            f"first at row {int(rows[0])}"
        )


def _check_pair(X: torch.Tensor, y: torch.Tensor, client: Any, xname: str, yname: str) -> None:
    if X.dim() != 2:
        raise ValueError(
            f"client {client!r}: {xname} must be 2-D (n_points, n_features), got shape {tuple(X.shape)}"
            + ("; for one feature use X[:, None]" if X.dim() == 1 else "")
        )
    if y.dim() != 1:
        raise ValueError(
            f"client {client!r}: {yname} must be 1-D (n_points,), got shape {tuple(y.shape)}"
            + ("; for a column vector use y.ravel()" if y.dim() == 2 and y.shape[1] == 1 else "")
        )
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"client {client!r}: {xname} has {X.shape[0]} rows but {yname} has {y.shape[0]}")
    if X.shape[1] == 0:
        raise ValueError(f"client {client!r}: {xname} has no features")
    _check_finite(X, client, xname)
    _check_finite(y, client, yname)


@dataclass(frozen=True, eq=False)
class ClientData:
    """The data one client holds: training inputs ``X`` (n, d), targets ``y`` (n,), an ``id``.

    Optional: a held-out test split (``X_test``, ``y_test``) used only for evaluation, and free
    ``metadata`` (e.g. ``{"fidelity": 0}`` or a C-MAPSS unit number), and ``noise``: known
    per-point noise variances for a ``FixedNoiseGaussianLikelihood`` (they stay with the data).
    Arrays are stored as float64 tensors. Raises ``ValueError`` for NaN/inf, wrong shapes or
    dtypes, fewer than two points, or constant targets (a GP marginal likelihood cannot be fitted to those).
    """

    X: torch.Tensor
    y: torch.Tensor
    id: Any = None
    X_test: torch.Tensor | None = None
    y_test: torch.Tensor | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    noise: torch.Tensor | None = None

    def __post_init__(self) -> None:
        cid = self.id
        X = _as_float_tensor(self.X, cid, "X")
        y = _as_float_tensor(self.y, cid, "y")
        _check_pair(X, y, cid, "X", "y")
        if X.shape[0] == 0:
            raise ValueError(f"client {cid!r}: X and y are empty; a client needs at least 2 points")
        if X.shape[0] == 1:
            raise ValueError(f"client {cid!r}: only a single point; a client needs at least 2 points")
        if bool((y == y[0]).all()):
            raise ValueError(
                f"client {cid!r}: y is constant ({float(y[0])!r} at all {y.shape[0]} points); "
                "its marginal likelihood has no information about the kernel"
            )
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        if (self.X_test is None) != (self.y_test is None):
            raise ValueError(f"client {cid!r}: give both X_test and y_test, or neither")
        if self.X_test is not None:
            Xt = _as_float_tensor(self.X_test, cid, "X_test")
            yt = _as_float_tensor(self.y_test, cid, "y_test")
            _check_pair(Xt, yt, cid, "X_test", "y_test")
            if Xt.shape[0] == 0:
                raise ValueError(f"client {cid!r}: X_test is empty; pass None for no test split")
            if Xt.shape[1] != X.shape[1]:
                raise ValueError(f"client {cid!r}: X_test has {Xt.shape[1]} features but X has {X.shape[1]}")
            object.__setattr__(self, "X_test", Xt)
            object.__setattr__(self, "y_test", yt)
        object.__setattr__(self, "metadata", dict(self.metadata))
        if self.noise is not None:
            noise = _as_float_tensor(self.noise, cid, "noise")
            if noise.shape != y.shape:
                raise ValueError(
                    f"client {cid!r}: noise must have one variance per training point, shape "
                    f"{tuple(y.shape)}, got {tuple(noise.shape)}"
                )
            _check_finite(noise, cid, "noise")
            if bool((noise <= 0).any()):
                raise ValueError(f"client {cid!r}: noise variances must be > 0, got min {float(noise.min())}")
            object.__setattr__(self, "noise", noise)

    @property
    def n(self) -> int:
        """Number of training points."""
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def has_test(self) -> bool:
        return self.X_test is not None

    def with_test(self, X_test: ArrayLike, y_test: ArrayLike) -> ClientData:
        return replace(self, X_test=X_test, y_test=y_test)

    def split(self, test_fraction: float, rng: np.random.Generator | int) -> ClientData:
        """Move a random ``test_fraction`` of the training points into the test split.

        At least two training points and one test point are kept; a client too small for that
        raises ``ValueError``.
        """
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        rng = np.random.default_rng(rng)
        n_test = int(round(test_fraction * self.n))
        n_test = min(max(n_test, 1), self.n - 2)
        if n_test < 1:
            raise ValueError(f"client {self.id!r}: {self.n} points are too few to split off a test set")
        perm = torch.from_numpy(rng.permutation(self.n))
        test, train = perm[:n_test].sort().values, perm[n_test:].sort().values
        noise = None if self.noise is None else self.noise[train]
        return replace(
            self, X=self.X[train], y=self.y[train], X_test=self.X[test], y_test=self.y[test], noise=noise
        )

    def __repr__(self) -> str:
        test = f", n_test={self.X_test.shape[0]}" if self.has_test else ""
        return f"ClientData(id={self.id!r}, n={self.n}, d={self.n_features}{test})"


class Federation(Sequence[ClientData]):
    """An ordered collection of clients: the unit that ``fedgp.fit`` trains on.

    Client order is fixed and defines client indices; ``weights`` are the FedAvg weights
    ``p_k = N_k / N``. Ids must be unique and all clients must have the same number of features.
    """

    def __init__(self, clients: Iterable[ClientData]) -> None:
        clients = list(clients)
        if not clients:
            raise ValueError("a federation needs at least one client")
        seen: dict[Any, int] = {}
        for index, client in enumerate(clients):
            if not isinstance(client, ClientData):
                raise ValueError(f"client at position {index} is a {type(client).__name__}, not ClientData")
            if client.id is None:
                client = replace(client, id=index)
                clients[index] = client
            if client.id in seen:
                raise ValueError(
                    f"duplicate client id {client.id!r} at positions {seen[client.id]} and {index}"
                )
            seen[client.id] = index
            if client.n_features != clients[0].n_features:
                raise ValueError(
                    f"client {client.id!r}: {client.n_features} features, but client "
                    f"{clients[0].id!r} has {clients[0].n_features}"
                )
        self._clients = tuple(clients)
        self._index = seen

    # -- container protocol -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._clients)

    def __getitem__(self, item):  # type: ignore[override]
        if isinstance(item, slice):
            return Federation(self._clients[item])
        return self._clients[item]

    def __iter__(self) -> Iterator[ClientData]:
        return iter(self._clients)

    def by_id(self, client_id: Any) -> ClientData:
        return self._clients[self.index_of(client_id)]

    def index_of(self, client_id: Any) -> int:
        try:
            return self._index[client_id]
        except KeyError:
            raise KeyError(f"no client with id {client_id!r}") from None

    # -- summaries ----------------------------------------------------------------------------
    @property
    def ids(self) -> list[Any]:
        return [c.id for c in self._clients]

    @property
    def sizes(self) -> torch.Tensor:
        """Training-set sizes ``N_k`` (long tensor)."""
        return torch.tensor([c.n for c in self._clients], dtype=torch.long)

    @property
    def weights(self) -> torch.Tensor:
        """FedAvg weights ``p_k = N_k / N`` (float64, sum to one)."""
        sizes = self.sizes.to(torch.float64)
        return sizes / sizes.sum()

    @property
    def n_features(self) -> int:
        return self._clients[0].n_features

    @property
    def has_test(self) -> bool:
        return any(c.has_test for c in self._clients)

    def summary(self) -> pd.DataFrame:
        """One row per client: id, n, n_test, weight."""
        return pd.DataFrame(
            {
                "id": self.ids,
                "n": self.sizes.numpy(),
                "n_test": [c.X_test.shape[0] if c.has_test else 0 for c in self._clients],
                "weight": self.weights.numpy(),
            }
        )

    # -- construction ---------------------------------------------------------------------------
    def split(self, test_fraction: float, seed: int = 0) -> Federation:
        """Split every client's data into train/test (independent seeded permutations)."""
        seeds = np.random.SeedSequence(seed).spawn(len(self))
        return Federation(
            c.split(test_fraction, np.random.default_rng(s)) for c, s in zip(self._clients, seeds)
        )

    @classmethod
    def from_partition(
        cls,
        X: ArrayLike,
        y: ArrayLike,
        parts: Sequence[np.ndarray],
        ids: Sequence[Any] | None = None,
    ) -> Federation:
        """Build clients from pooled arrays and a list of row-index arrays (one per client)."""
        X = _as_float_tensor(X, "<pooled>", "X")
        y = _as_float_tensor(y, "<pooled>", "y")
        ids = list(range(len(parts))) if ids is None else list(ids)
        if len(ids) != len(parts):
            raise ValueError(f"{len(parts)} partitions but {len(ids)} ids")
        return cls(
            ClientData(
                X[torch.as_tensor(np.asarray(p), dtype=torch.long)],
                y[torch.as_tensor(np.asarray(p), dtype=torch.long)],
                id=i,
            )
            for i, p in zip(ids, parts)
        )

    def __repr__(self) -> str:
        sizes = self.sizes
        return (
            f"Federation({len(self)} clients, N={int(sizes.sum())}, d={self.n_features}, "
            f"sizes {int(sizes.min())}..{int(sizes.max())}{', with test splits' if self.has_test else ''})"
        )
