"""Means that are linear in their parameters: ``m(x; θ) = φ(x)ᵀ θ``, and closed forms for them.

The clustered-regression papers work with linear models. In fedgp a cluster is a GP whose mean
function is linear in its parameters (``gpytorch.means.LinearMean``, ``ConstantMean``, or any
mean with that property); with :class:`~fedgp.models.ZeroKernel` and a fixed noise σ² the GP *is*
linear regression: the per-point negative log marginal likelihood of a client is

    F_i(θ) = ‖y_i − Φ_i θ‖² / (2 σ² n_i) + ½ log(2π σ²).

:class:`LinearMeanModel` maps a spec's mean parameters to one vector θ and computes the features
φ(x). For the noise-only model it also evaluates, on a client's own data, the quantities the
strategies need in closed form — the NLL, s full-batch gradient steps, the FedProx proximal step
(Su, Xu & Yang's Lemma 1), the gradient, the local least-squares fit and the within-client moment
statistics of Phase 1. These run *on the client* (from ``ClientOps.clients``); they equal what the
engine's generic GPyTorch path computes, which the tests check to rounding error.
"""

from __future__ import annotations

import math
import weakref

import gpytorch
import torch

from fedgp.data.client import ClientData
from fedgp.errors import InputError
from fedgp.models.spec import GPSpec, ZeroKernel
from fedgp.models.state import HyperState

__all__ = ["LinearMeanModel", "linear_model", "NOISE"]

#: The state name of a Gaussian likelihood's noise variance.
NOISE = "likelihood.noise_covar.noise"

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def linear_model(spec: GPSpec) -> LinearMeanModel:
    """The (cached) :class:`LinearMeanModel` of ``spec``; ``ValueError`` if its mean is not linear."""
    try:
        return _CACHE[spec]
    except KeyError:
        model = _CACHE[spec] = LinearMeanModel(spec)
        return model


class LinearMeanModel:
    """The mean parameters of a spec as one vector, and the features with ``m(x) = φ(x)ᵀθ``.

    Raises ``ValueError`` (naming the mean) when the mean has no parameters, when a mean
    parameter is constrained or fixed, or — checked on the first client's inputs — when the mean
    is not linear in its parameters.
    """

    def __init__(self, spec: GPSpec) -> None:
        mean = spec.mean
        name = type(mean).__name__
        params = [p for p in spec.params if p.name.startswith("mean_module.")]
        if not params:
            raise InputError(
                f"the mean {name} has no parameters; clustered linear regression and Phase 1 need a "
                "mean linear in its parameters, e.g. gpytorch.means.LinearMean(d, bias=False)"
            )
        for p in params:
            if p.constraint is not None:
                raise InputError(
                    f"mean parameter {p.name} of {name} is constrained ({p.constraint}); "
                    "a linear mean needs unconstrained parameters"
                )
            if not p.trainable:
                raise InputError(
                    f"mean parameter {p.name} of {name} is fixed; all mean parameters must train"
                )
        self.spec = spec
        self.mean_name = name
        self.names = tuple(p.name for p in params)
        self.shapes = tuple(p.shape for p in params)
        self.numels = tuple(int(math.prod(s)) for s in self.shapes)
        self.dim = sum(self.numels)
        self._relative = tuple(p.raw_name[len("mean_module.") :] for p in params)
        self._kind = "generic"
        if isinstance(mean, gpytorch.means.LinearMean) and mean.weights.dim() == 2:
            self._kind = "linear"
        elif isinstance(mean, gpytorch.means.ConstantMean) and self.dim == 1:
            self._kind = "constant"
        self._checked = self._kind != "generic"
        self._stacks: dict = {}
        trainable = {p.name for p in spec.params if p.trainable}
        self.noise_only = (
            isinstance(spec.kernel, ZeroKernel)
            and NOISE in spec.names
            and isinstance(spec.likelihood, gpytorch.likelihoods.GaussianLikelihood)
            and trainable <= set(self.names)
        )

    # -- θ <-> states -----------------------------------------------------------------------------
    def vector(self, states: HyperState) -> torch.Tensor:
        """The mean parameters of (batched) states as vectors: ``(*batch, p)``."""
        batch = tuple(states.batch_shape)
        return torch.cat([states[n].reshape(*batch, -1) for n in self.names], dim=-1)

    def with_vector(self, states: HyperState, theta: torch.Tensor) -> HyperState:
        """``states`` with their mean parameters replaced by ``theta`` (``(*batch, p)``)."""
        batch = tuple(states.batch_shape)
        values = dict(states)
        start = 0
        for name, shape, size in zip(self.names, self.shapes, self.numels):
            values[name] = theta[..., start : start + size].reshape(*batch, *shape).clone()
            start += size
        return HyperState(values, states.event_shapes)

    def noise(self, states: HyperState) -> torch.Tensor:
        """The noise variance σ² of (batched) states: ``(*batch,)``."""
        return states[NOISE].reshape(*states.batch_shape, -1)[..., 0]

    # -- features -----------------------------------------------------------------------------------
    def features(self, X: torch.Tensor, client: ClientData | None = None) -> torch.Tensor:
        """φ(X): ``(n, p)`` with ``m(X; θ) = φ(X) θ``, from the columns the mean reads
        (:meth:`~fedgp.GPSpec.mean_inputs`: a multi-output spec's mean of the features not its output
        column)."""
        X = self.spec.mean_inputs(X)
        if self._kind == "linear":
            cols = []
            for rel in self._relative:
                cols.append(X if rel == "weights" else torch.ones(len(X), 1, dtype=X.dtype))
            return cols[0] if len(cols) == 1 else torch.cat(cols, dim=1)
        if self._kind == "constant":
            return torch.ones(len(X), 1, dtype=X.dtype)
        phi = self._jacobian(X, torch.zeros(self.dim, dtype=X.dtype))
        if not self._checked:
            self._check_linear(X, phi, client)
        return phi

    def _call(self, X: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        params, start = {}, 0
        for rel, shape, size in zip(self._relative, self.shapes, self.numels):
            params[rel] = theta[start : start + size].reshape(shape)
            start += size
        return torch.func.functional_call(self.spec.mean, params, (X,))

    def _jacobian(self, X: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        return torch.func.jacrev(lambda v: self._call(X, v))(at).reshape(len(X), self.dim)

    def _check_linear(self, X: torch.Tensor, phi: torch.Tensor, client: ClientData | None) -> None:
        gen = torch.Generator().manual_seed(0)
        where = f" on client {client.id!r}" if client is not None else ""
        for _ in range(2):
            theta = torch.randn(self.dim, generator=gen, dtype=X.dtype)
            with torch.no_grad():
                value = self._call(X, theta)
            other = self._jacobian(X, theta)
            scale = 1.0 + float(value.abs().max())
            if float((value - phi @ theta).abs().max()) > 1e-8 * scale or not torch.allclose(
                other, phi, rtol=1e-8, atol=1e-10
            ):
                raise InputError(
                    f"the mean {self.mean_name} is not linear in its parameters{where}: "
                    "m(x; θ) ≠ φ(x)ᵀθ. Clustered linear regression in closed form and Phase 1 (moment "
                    "descent) need such a mean, e.g. LinearMean or ConstantMean"
                )
        self._checked = True

    # -- closed forms for the noise-only model --------------------------------------------------------
    # Batched over clients of equal size: ``phi`` (G, n, p), ``y`` (G, n), ``theta`` (G, e, p),
    # ``noise``/``lr`` (G, e). :meth:`map_clients` groups a batch of clients by size and calls them.

    def map_clients(self, clients, fn, *tensors: torch.Tensor) -> torch.Tensor:
        """``fn(phi, y, *per_client)`` by groups of equal-size clients, results back in client order.

        Every tensor in ``tensors`` has a leading client dimension B followed by state dims ``E``;
        ``fn`` receives them flattened to ``(G, e, ...)`` and returns ``(G, e, ...)``.
        """
        groups = self._grouped(clients)
        batch = tuple(tensors[0].shape[1:-1]) if tensors[0].dim() > 2 else ()
        out = None
        for rows, phi, y in groups:
            idx = rows
            args = []
            for t in tensors:
                t = t[rows]
                args.append(t.reshape(len(idx), -1, *t.shape[1 + len(batch) :]))
            res = fn(phi, y, *args)
            res = res.reshape(len(idx), *batch, *res.shape[2:])
            if out is None:
                out = res.new_empty((len(clients), *res.shape[1:]))
            out[rows] = res
        return out

    def _grouped(self, clients) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Clients grouped by size: (positions, stacked features, stacked targets) per group.

        Engines hand the same client objects every round, so the stacks are cached for the last few
        batches; an entry holds the clients themselves, so their ids cannot be reused while cached.
        """
        key = tuple(id(c) for c in clients)
        hit = self._stacks.get(key)
        if hit is not None:
            return hit[1]
        groups: dict[int, list[int]] = {}
        for b, c in enumerate(clients):
            groups.setdefault(c.n, []).append(b)
        out = []
        for idx in groups.values():
            phi = torch.stack([self.features(clients[b].X, clients[b]) for b in idx])
            out.append((torch.tensor(idx), phi, torch.stack([clients[b].y for b in idx])))
        self._stacks[key] = (list(clients), out)
        while len(self._stacks) > 8:
            self._stacks.pop(next(iter(self._stacks)))
        return out

    @staticmethod
    def _residuals(phi, y, theta):
        return y.unsqueeze(1) - theta @ phi.transpose(-1, -2)  # (G, e, n)

    def nll(self, clients, theta: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Per-point NLL of the noise-only GP, ``‖y − Φθ‖²/(2σ²n) + ½ log 2πσ²``: theta ``(B, *E, p)``,
        noise ``(B, *E)`` -> ``(B, *E)``."""

        def fn(phi, y, th, s2):
            r = self._residuals(phi, y, th)
            return r.pow(2).mean(-1, keepdim=True) / (2 * s2) + 0.5 * torch.log(2 * math.pi * s2)

        return self.map_clients(clients, fn, theta, noise.unsqueeze(-1))[..., 0]

    def sse(self, clients, theta: torch.Tensor) -> torch.Tensor:
        """Squared error ``‖y − Φθ‖²``: theta ``(B, *E, p)`` -> ``(B, *E)``."""
        out = self.map_clients(
            clients, lambda phi, y, th: self._residuals(phi, y, th).pow(2).sum(-1).unsqueeze(-1), theta
        )
        return out[..., 0]

    def gradient(self, clients, theta: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """∇_θ of the per-point NLL, ``Φᵀ(Φθ − y)/(σ² n)``: ``(B, *E, p)``."""

        def fn(phi, y, th, s2):
            r = self._residuals(phi, y, th)
            return -(r @ phi) / (s2 * phi.shape[1])

        return self.map_clients(clients, fn, theta, noise.unsqueeze(-1))

    def gradient_steps(
        self, clients, theta: torch.Tensor, noise: torch.Tensor, lr: torch.Tensor, steps: int
    ) -> torch.Tensor:
        """``steps`` full-batch gradient steps on the per-point NLL with step ``lr`` (``(B, *E)``)."""

        def fn(phi, y, th, a):
            a = a / phi.shape[1]
            for _ in range(steps):
                th = th + a * (self._residuals(phi, y, th) @ phi)
            return th

        return self.map_clients(clients, fn, theta, (lr / noise).unsqueeze(-1))

    def proximal_step(
        self, clients, theta: torch.Tensor, noise: torch.Tensor, lr: torch.Tensor
    ) -> torch.Tensor:
        """``argmin_u F_i(u) + ‖u − θ‖²/(2 lr)``: ``θ + a Φᵀ (I + a ΦΦᵀ)⁻¹ (y − Φθ)``, ``a = lr/(σ² n)``."""

        def fn(phi, y, th, a):
            a = a / phi.shape[1]  # (G, e, 1)
            r = self._residuals(phi, y, th)  # (G, e, n)
            n = phi.shape[1]
            gram = (phi @ phi.transpose(-1, -2)).unsqueeze(1)  # (G, 1, n, n)
            system = torch.eye(n, dtype=phi.dtype) + a.unsqueeze(-1) * gram
            u = torch.linalg.solve(system, r.unsqueeze(-1)).squeeze(-1)
            return th + a * (u @ phi)

        return self.map_clients(clients, fn, theta, (lr / noise).unsqueeze(-1))

    def local_fit(self, client: ClientData, ridge: float = 0.0) -> torch.Tensor:
        """The client's own least-squares estimate (minimum-norm when ``n < p``; ridge if > 0)."""
        phi = self.features(client.X, client)
        if ridge > 0:
            n, p = phi.shape
            if n < p:
                return phi.T @ torch.linalg.solve(
                    phi @ phi.T + ridge * n * torch.eye(n, dtype=phi.dtype), client.y
                )
            return torch.linalg.solve(
                phi.T @ phi + ridge * n * torch.eye(p, dtype=phi.dtype), phi.T @ client.y
            )
        return torch.linalg.pinv(phi) @ client.y

    def residuals(self, client: ClientData, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One client: φ(X) and the residuals ``y − φ(X) θ`` for θ ``(*E, p)``: ``(n, p)``, ``(*E, n)``."""
        phi = self.features(client.X, client)
        return phi, client.y - theta @ phi.T

    # -- Phase 1 statistics ---------------------------------------------------------------------------
    def moment_terms(
        self, client: ClientData, theta: torch.Tensor, pairing: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-point vectors ε_j = (y_j − φ_jᵀθ) φ_j used by the moment statistics.

        Returns ``E`` of shape ``(*E, m, p)`` over the points used (all of them for ``"ustat"``,
        the first two for ``"first_pair"``) and their number ``m``.
        """
        phi, r = self.residuals(client, theta)
        if pairing == "first_pair":
            phi, r = phi[:2], r[..., :2]
        elif pairing != "ustat":
            raise InputError(f"pairing must be 'ustat' or 'first_pair', got {pairing!r}")
        return r.unsqueeze(-1) * phi, torch.tensor(phi.shape[0])

    def second_moment(self, client: ClientData, theta: torch.Tensor, pairing: str = "ustat") -> torch.Tensor:
        """The within-client U-statistic ``Y_c = (S Sᵀ − EᵀE) / (m(m−1))``, ``S = Σ_j ε_j``: ``(*E, p, p)``.

        Its expectation is ``Σ_z (θ*_z − θ)(θ*_z − θ)ᵀ Σ_z`` for a client of cluster z (every pair of
        distinct points is independent given the cluster). With ``"first_pair"`` it is the
        symmetrised product of the first two points, the paper's one-pair statistic.
        """
        E, m = self.moment_terms(client, theta, pairing)
        S = E.sum(-2)
        return (S.unsqueeze(-1) * S.unsqueeze(-2) - E.transpose(-1, -2) @ E) / (m * (m - 1))

    def second_moment_times(
        self, client: ClientData, theta: torch.Tensor, Q: torch.Tensor, pairing: str = "ustat"
    ) -> torch.Tensor:
        """``Y_c Q`` without forming ``Y_c`` (``Y_c`` is symmetric): ``(*E, p, r)``."""
        E, m = self.moment_terms(client, theta, pairing)
        S = E.sum(-2)
        EQ = E @ Q  # (*E, m, r)
        return (S.unsqueeze(-1) * (S.unsqueeze(-2) @ Q) - E.transpose(-1, -2) @ EQ) / (m * (m - 1))
