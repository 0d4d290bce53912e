"""Neural-network baselines: a FedAvg MLP and its Ditto personalisation (Li et al. 2021).

These are what FGPR is compared with on NASA (a FedAvg network, §6) and SARCOS (Ditto, §7). They
are point predictors trained by FedAvg over network weights, not GP hyper-parameter strategies,
so they have their own loop instead of :func:`fedgp.fit`. All clients are trained at once: each
weight tensor carries a leading client axis and a client's forward pass is a batched matrix
product, so a round over 60 clients costs about as much as one client. Each client's loss touches
only its own slice of the weights, so the result is exactly K independent local trainings.

Ditto: the global model ``w`` is trained by FedAvg; each client also keeps a personal model
``v_k`` and takes steps on ``h_k(v) = F_k(v) + (λ/2)||v - w||²``. Each personal step is a gradient
step on ``F_k`` followed by the exact proximal map of the quadratic,
``v ← (v' + ηλ w) / (1 + ηλ)`` — with SGD (the default) this is proximal gradient descent on
``h_k``, with the same stationary points as Ditto's plain gradient step but stable for every λ, so
that λ = 0 *is* local training and λ → ∞ *is* the global model (with Adam it is a preconditioned
variant). Personal steps follow each aggregation and are anchored at the new global model
(Ditto's Algorithm 1 with the personal update taken against the freshly averaged model, so the
final personal models are anchored at the final global one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedgp.baselines._common import (
    Stacked,
    check_federation,
    client_position,
    point_prediction,
    shared_prediction,
    stack,
)
from fedgp.data.client import ClientData, Federation
from fedgp.errors import InputError, NotFittedError, UnknownClientError
from fedgp.models.posterior import Prediction
from fedgp.rng import generator

__all__ = ["FedAvgMLP", "Ditto", "fit_ditto", "mlp_forward", "init_mlp"]

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}


def init_mlp(sizes: Sequence[int], seed: int) -> list[torch.Tensor]:
    """Weights ``[W1, b1, W2, b2, ...]`` (``W_i`` of shape (fan_in, fan_out)), drawn as
    ``torch.nn.Linear`` does: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weights and biases."""
    gen = torch.Generator().manual_seed(int(generator(seed, "mlp-init").integers(2**62)))
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / math.sqrt(fan_in)
        params.append((torch.rand(fan_in, fan_out, generator=gen, dtype=torch.float64) * 2 - 1) * bound)
        params.append((torch.rand(fan_out, generator=gen, dtype=torch.float64) * 2 - 1) * bound)
    return params


def mlp_forward(params: Sequence[torch.Tensor], X: torch.Tensor, activation: str = "relu") -> torch.Tensor:
    """Batched MLP: ``params`` with a leading batch axis B (``W (B, din, dout)``, ``b (B, dout)``),
    ``X (B, m, din)`` -> ``(B, m)``."""
    act = _ACTIVATIONS[activation]
    h = X
    layers = len(params) // 2
    for i in range(layers):
        W, b = params[2 * i], params[2 * i + 1]
        h = torch.baddbmm(b.unsqueeze(1), h, W)
        if i < layers - 1:
            h = act(h)
    return h.squeeze(-1)


def _draw_keys(gens, sizes_per_group, n_max: int, steps: int, copies: int = 1) -> torch.Tensor:
    """Uniform sort keys ``(steps, copies * B, n_max)`` for minibatch draws, B = all groups' clients
    (rows ordered copy-major). Group g's keys come from its own generator, drawn as if it were
    alone, so a group trains identically whether or not other groups are batched with it."""
    B = sum(len(sz) for sz in sizes_per_group)
    keys = torch.full((steps, copies, B, n_max), 2.0, dtype=torch.float64)
    start = 0
    for gen, sizes in zip(gens, sizes_per_group):
        K, n = len(sizes), int(max(sizes))
        draw = torch.rand((steps, copies * K, n), generator=gen, dtype=torch.float64)
        keys[:, :, start : start + K, :n] = draw.reshape(steps, copies, K, n)
        start += K
    return keys.reshape(steps, copies * B, n_max)


def _minibatches(data: Stacked, batch_size: int | None, keys: torch.Tensor | None, steps: int):
    """Per step and client, ``min(M, N_k)`` rows drawn uniformly without replacement (the rows
    with the smallest keys; all rows if ``batch_size`` is None)."""
    if batch_size is None or batch_size >= data.X.shape[1]:
        return [(data.X, data.y, data.mask)] * steps
    idx = keys.masked_fill(~data.mask, 2.0).argsort(dim=-1)[..., :batch_size]
    out = []
    for s in range(steps):
        i = idx[s]
        X = torch.gather(data.X, 1, i.unsqueeze(-1).expand(-1, -1, data.X.shape[-1]))
        out.append((X, torch.gather(data.y, 1, i), torch.gather(data.mask, 1, i)))
    return out


def _mse(pred: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-client mean squared error over the unpadded rows."""
    return ((pred - y) ** 2 * mask).sum(1) / mask.sum(1)


def _local_steps(
    params: list[torch.Tensor],
    batches: list,
    optimizer: str,
    lr: float,
    activation: str,
    anchor: list[torch.Tensor] | None = None,
    lam: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """One optimiser step per minibatch of ``batches`` for every client on its own mean squared
    error, optimiser state fresh at the start (``torch.optim`` on the stacked weights: Adam and SGD
    act elementwise, so this is exactly one optimiser per client). With ``anchor``/``lam`` each
    step is followed by the proximal map of ``(λ/2)||v - anchor||²`` (λ one per client row)."""
    leaves = [p.detach().clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adam(leaves, lr=lr) if optimizer == "adam" else torch.optim.SGD(leaves, lr=lr)
    if anchor is not None:
        # prox of (ηλ/2)||u - a||² at v: (v + ηλ a) / (1 + ηλ) = keep * v + (1 - keep) * a; ηλ = inf -> a
        keep = 1.0 / (1.0 + lr * lam.to(leaves[0].dtype))
        keeps = [keep.reshape(-1, *([1] * (v.dim() - 1))) for v in leaves]
        pulled = [(1.0 - k) * a for k, a in zip(keeps, anchor)]
    for X, y, mask in batches:
        opt.zero_grad(set_to_none=True)
        pred = mlp_forward(leaves, X, activation)
        _mse(pred, y, mask).sum().backward()
        opt.step()
        if anchor is not None:
            with torch.no_grad():
                for v, k, a in zip(leaves, keeps, pulled):
                    v.mul_(k).add_(a)
    return [v.detach() for v in leaves]


def _check_optimizer(name: str) -> None:
    if name not in ("adam", "sgd"):
        raise InputError(f"optimizer must be 'adam' or 'sgd', got {name!r}")


def _check_architecture(federation: Federation, hidden: Sequence[int], activation: str) -> None:
    if activation not in _ACTIVATIONS:
        raise InputError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    if not hidden or any(int(h) < 1 for h in hidden):
        raise InputError(f"hidden must be a non-empty sequence of positive widths, got {hidden!r}")


def _weighted_mse(params, federation: Federation, activation: str, personal: bool) -> np.ndarray:
    """Per-client MSE on the clients' training rows (``personal``: row k of params for client k)."""
    data = stack(federation)
    K = len(federation)
    p = params if personal else [t.expand(K, *t.shape) for t in params]
    with torch.no_grad():
        pred = mlp_forward(p, data.X, activation)
        return _mse(pred, data.y, data.mask).numpy()


@dataclass
class _MLPConfig:
    """The FedAvg training settings, shared by :class:`FedAvgMLP` and :class:`Ditto`."""

    hidden: tuple[int, ...] = (64, 64)
    activation: str = "relu"
    rounds: int = 200
    local_steps: int = 5
    batch_size: int | None = 32
    lr: float = 1e-3
    optimizer: str = "adam"
    seed: int = 0

    def _config(self) -> _MLPConfig:
        """These settings alone (``hidden`` as a tuple), without a subclass's other fields."""
        values = {f.name: getattr(self, f.name) for f in fields(_MLPConfig)}
        return _MLPConfig(**{**values, "hidden": tuple(values["hidden"])})


def _history(train_mse: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"round": np.arange(1, len(train_mse) + 1), "train_mse": train_mse})


def _predict(params: Sequence[torch.Tensor], X, activation: str) -> torch.Tensor:
    """One model's weights (no batch axis) at ``X``."""
    X = _as_X(X, params[0].shape[0])
    with torch.no_grad():
        return mlp_forward([t.unsqueeze(0) for t in params], X.unsqueeze(0), activation)[0]


def _join(feds: Sequence[Federation]) -> tuple[Stacked, torch.Tensor, list[list[int]]]:
    """All groups' clients stacked on one client axis (padded to the longest), the group of each
    row, and each group's client sizes. Weights ``p_k`` are within each group."""
    parts = [stack(f) for f in feds]
    n_max = max(p.X.shape[1] for p in parts)

    def pad(t, value=0):
        extra = n_max - t.shape[1]
        if not extra:
            return t
        return torch.cat([t, torch.full((t.shape[0], extra, *t.shape[2:]), value, dtype=t.dtype)], dim=1)

    data = Stacked(
        torch.cat([pad(p.X) for p in parts]),
        torch.cat([pad(p.y) for p in parts]),
        torch.cat([pad(p.mask, False) for p in parts]),
        torch.cat([p.sizes for p in parts]),
        torch.cat([p.weights for p in parts]),
    )
    group = torch.cat([torch.full((len(f),), g, dtype=torch.long) for g, f in enumerate(feds)])
    return data, group, [p.sizes.tolist() for p in parts]


def _torch_gen(seed: int, stream: str) -> torch.Generator:
    return torch.Generator().manual_seed(int(generator(seed, stream).integers(2**62)))


def _check_groups(cfgs: Sequence[_MLPConfig], feds: Sequence[Federation]) -> _MLPConfig:
    """The groups' one configuration (seeds aside), checked against every federation."""
    cfg = cfgs[0]
    if any(replace(c, seed=0) != replace(cfg, seed=0) for c in cfgs):
        raise InputError("grouped training needs configurations that differ only in their seed")
    for f in feds:
        _check_architecture(f, cfg.hidden, cfg.activation)
    _check_optimizer(cfg.optimizer)
    return cfg


def _lam_lists(lams: Sequence[float] | Sequence[Sequence[float]], groups: int) -> list[list[float]]:
    """One list of λ candidates per group, all of one length (one list given: the same for all)."""
    per_group = [list(lams)] * groups if not len(lams) or np.isscalar(lams[0]) else [list(v) for v in lams]
    if len(per_group) != groups or any(len(v) != len(per_group[0]) for v in per_group):
        raise InputError("lams must be one list of candidates, or one list per group of equal lengths")
    return per_group


def _fedavg(local: list[torch.Tensor], p: torch.Tensor, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """FedAvg within each group, summed exactly as a lone group would sum (bitwise reproducible)."""
    return [
        torch.stack([(p[r].reshape(-1, *([1] * (loc.dim() - 1))) * loc[r]).sum(0) for r in rows])
        for loc in local
    ]


def _train(
    cfgs: Sequence[_MLPConfig],
    feds: Sequence[Federation],
    lams: Sequence[float] | Sequence[Sequence[float]] = (),
    personal_steps: int = 0,
    personal_lr: float = 0.0,
    personal_optimizer: str = "sgd",
) -> list[tuple[list[torch.Tensor], list[torch.Tensor] | None, list[float]]]:
    """FedAvg (and Ditto personal models for each λ in ``lams``: one list for all groups, or one
    list per group, of equal lengths) for G independent groups at once.

    Group g is federation ``feds[g]`` trained with ``cfgs[g]``; configurations may differ only in
    their seed. Groups share nothing but the tensor program: each has its own global model,
    average and random streams, so a group trains exactly as it would alone. Returns, per group,
    the global weights, the personal weights (batch ``L * K_g``, λ-major) or None, and the
    federated training MSE per round.
    """
    cfg = _check_groups(cfgs, feds)
    data, group, sizes = _join(feds)
    G, B, d, n_max = len(feds), data.X.shape[0], data.X.shape[-1], data.X.shape[1]
    w = [torch.stack(ts) for ts in zip(*(init_mlp([d, *cfg.hidden, 1], c.seed) for c in cfgs))]  # (G, ...)
    gens = [_torch_gen(c.seed, "fedavg-minibatch") for c in cfgs]
    p = data.weights
    per_group = _lam_lists(lams, G)
    L = len(per_group[0])
    if L:
        pgens = [_torch_gen(c.seed, "ditto-personal") for c in cfgs]
        _check_optimizer(personal_optimizer)
        rep = Stacked(
            data.X.repeat(L, 1, 1), data.y.repeat(L, 1), data.mask.repeat(L, 1), data.sizes.repeat(L), p
        )
        lam = torch.tensor(per_group, dtype=torch.float64).T[:, group].reshape(-1)  # (L * B,), λ-major
        personal = [t[group].repeat(L, *([1] * (t.dim() - 1))) for t in w]
    rows = [(group == g).nonzero().flatten() for g in range(G)]
    history = []
    with_keys = cfg.batch_size is not None and cfg.batch_size < n_max
    for _ in range(cfg.rounds):
        keys = _draw_keys(gens, sizes, n_max, cfg.local_steps) if with_keys else None
        batches = _minibatches(data, cfg.batch_size, keys, cfg.local_steps)
        w = _fedavg(
            _local_steps([t[group] for t in w], batches, cfg.optimizer, cfg.lr, cfg.activation), p, rows
        )
        if L:
            anchor = [t[group].repeat(L, *([1] * (t.dim() - 1))) for t in w]
            keys = _draw_keys(pgens, sizes, n_max, personal_steps, L) if with_keys else None
            batches = _minibatches(rep, cfg.batch_size, keys, personal_steps)
            personal = _local_steps(
                personal, batches, personal_optimizer, personal_lr, cfg.activation, anchor, lam
            )
        with torch.no_grad():
            per_client = _mse(mlp_forward([t[group] for t in w], data.X, cfg.activation), data.y, data.mask)
        history.append(torch.stack([(p[r] * per_client[r]).sum() for r in rows]))
    history = torch.stack(history) if history else torch.zeros(0, G)
    out = []
    for g in range(G):
        mine = None
        if L:
            idx = (torch.arange(L).unsqueeze(1) * B + rows[g].unsqueeze(0)).reshape(-1)
            mine = [t[idx] for t in personal]
        out.append(([t[g] for t in w], mine, history[:, g].tolist()))
    return out


def _as_X(X, d: int) -> torch.Tensor:
    X = torch.as_tensor(np.asarray(X) if not isinstance(X, torch.Tensor) else X, dtype=torch.float64)
    if X.dim() != 2 or X.shape[1] != d:
        raise InputError(f"X must have shape (n, {d}), got {tuple(X.shape)}")
    return X


@dataclass
class FedAvgMLP(_MLPConfig):
    """A multilayer perceptron trained by FedAvg (McMahan et al. 2017); one global model.

    Args:
        hidden: widths of the hidden layers (two layers: the FGPR paper's best NASA network).
        activation: ``"relu"`` or ``"tanh"``.
        rounds: communication rounds; every client participates in every round.
        local_steps: optimiser steps per client per round, each on a minibatch of ``batch_size``
            rows drawn without replacement (``None``: the client's whole data).
        lr, optimizer: ``"adam"`` (state restarted every round) or ``"sgd"``.
        seed: initial weights and minibatches.
        noise_variance: the variance of the Gaussian predictive around the network's output (for NLL
            and coverage): the residual variance on held-out clients (:meth:`mse` of a network
            trained without them); default: the federated training MSE of the fit (optimistic).

    After ``fit``: ``params_`` (weights ``[W1, b1, ...]``), ``history_`` (round, training MSE).
    ``predict(X, client)`` is ``N(network(X), noise_variance)``, the same for every client.
    """

    noise_variance: float | None = None
    params_: list[torch.Tensor] | None = field(default=None, init=False, repr=False)
    history_: pd.DataFrame | None = field(default=None, init=False, repr=False)
    federation_: Federation | None = field(default=None, init=False, repr=False)

    def fit(self, federation: Federation) -> FedAvgMLP:
        """Train the MLP by FedAvg over the federation's clients; returns ``self``."""
        check_federation(federation, "FedAvgMLP")
        if self.noise_variance is not None and not self.noise_variance > 0:
            raise InputError(f"noise_variance must be positive or None, got {self.noise_variance}")
        [(w, _, history)] = _train([self._config()], [federation])
        self.params_, self.federation_ = w, federation
        self.history_ = _history(history)
        return self

    def network(self, X) -> torch.Tensor:
        """The network's output at ``X``: the point prediction every client gets."""
        if self.params_ is None:
            raise NotFittedError("FedAvgMLP is not fitted yet; call fit(federation)")
        return _predict(self.params_, X, self.activation)

    def predict(self, X, client: Any = None) -> Prediction:
        """``N(network(X), noise_variance)`` (:func:`~fedgp.baselines._common.point_prediction`) for
        ``client``: the same for every client, so ``client`` (a position, an id or a ``ClientData``,
        new ones included) is only checked."""
        return shared_prediction(self, self.network(X), client)

    def mse(self, federation: Federation) -> float:
        """``Σ p_k MSE_k`` of the global model on the clients' training rows (e.g. held-out clients)."""
        if self.params_ is None:
            raise NotFittedError("FedAvgMLP is not fitted yet; call fit(federation)")
        per = _weighted_mse(self.params_, federation, self.activation, False)
        return float(np.dot(federation.weights.numpy(), per))


@dataclass
class Ditto(_MLPConfig):
    """Ditto (Li et al. 2021): a FedAvg MLP plus a personal MLP per client, λ-regularised to it.

    Args (besides those of :class:`FedAvgMLP`):
        lam: λ, or several candidates: then each client's training rows are split
            (``validation_fraction`` held out), Ditto is trained once with a personal model per
            candidate, and the λ with the lowest mean per-client validation RMSE is kept; the final
            models are then trained on all rows. The FGPR paper gives no λ; the defaults are the
            grid {0.01, 0.1, 1} widened by a decade on each side.
        personal_steps: personal steps per round; ``personal_lr``/``personal_optimizer`` for them
            (``"sgd"``: exact proximal gradient descent on Ditto's objective).
        validation_fraction: share of each client's rows held out to choose λ and to estimate the
            residual variances used for NLL/coverage (0: no validation, a single λ is required and
            the variances are the training MSEs, which are optimistic).

    After ``fit``: ``lam_``, ``global_`` (FedAvg weights), ``personal_`` (batch K), ``validation_``
    (λ, mean validation RMSE of the personal models), ``noise_variance_`` (per client, personal),
    ``global_noise_variance_``, ``history_``. ``predict(X, client)``: the client's personal model
    with its residual variance; ``predict_global(X)``: the FedAvg model (also for a new client).
    """

    lam: float | Sequence[float] = (0.001, 0.01, 0.1, 1.0, 10.0)
    personal_steps: int = 5
    personal_lr: float = 0.05
    personal_optimizer: str = "sgd"
    validation_fraction: float = 0.2
    lam_: float | None = field(default=None, init=False)
    global_: list[torch.Tensor] | None = field(default=None, init=False, repr=False)
    personal_: list[torch.Tensor] | None = field(default=None, init=False, repr=False)
    validation_: pd.DataFrame | None = field(default=None, init=False, repr=False)
    noise_variance_: np.ndarray | None = field(default=None, init=False, repr=False)
    global_noise_variance_: float | None = field(default=None, init=False, repr=False)
    history_: pd.DataFrame | None = field(default=None, init=False, repr=False)
    federation_: Federation | None = field(default=None, init=False, repr=False)

    def _lams(self) -> list[float]:
        lams = [float(self.lam)] if np.isscalar(self.lam) else [float(v) for v in self.lam]
        if not lams or any(not v >= 0 for v in lams):
            raise InputError(f"lam must be >= 0 (one value or several candidates), got {self.lam!r}")
        return lams

    def fit(self, federation: Federation) -> Ditto:
        """Train the global MLP and every client's personal MLP (λ chosen on validation rows); returns
        ``self``."""
        fit_ditto([self], [federation])
        return self

    def predict(self, X, client: int | ClientData | Any) -> Prediction:
        """Client ``client``'s personal model at ``X`` (a position, an id or one of the fitted
        federation's ``ClientData``), as a Gaussian with its residual variance."""
        position = client_position(self.federation_, client, "Ditto")
        if position is None:
            raise UnknownClientError(
                f"client {client.id!r} is not one Ditto was fitted on: it has no personal model; "
                "predict_global(X) is the model a new client gets"
            )
        mean = _predict([t[position] for t in self.personal_], X, self.activation)
        return point_prediction(mean, float(self.noise_variance_[position]))

    def predict_global(self, X) -> Prediction:
        """The FedAvg (global) model at ``X``, as a Gaussian with its residual variance."""
        if self.global_ is None:
            raise NotFittedError("Ditto is not fitted yet; call fit(federation)")
        return point_prediction(
            _predict(self.global_, X, self.activation), float(self.global_noise_variance_)
        )


def fit_ditto(models: Sequence[Ditto], federations: Sequence[Federation]) -> list[Ditto]:
    """Fit several :class:`Ditto` models, model g on ``federations[g]``, in one batched program.

    The models may differ only in their ``seed`` (e.g. one per SARCOS output, each on its own
    federation); each ends exactly as ``models[g].fit(federations[g])`` would leave it — λ chosen
    on its own validation rows — but the Python overhead of the training loop is paid once.
    """
    if len(models) != len(federations) or not models:
        raise InputError("fit_ditto needs one federation per model")
    first = models[0]
    for m in models:
        if replace(m, seed=0) != replace(first, seed=0):
            raise InputError("fit_ditto: models must differ only in their seed")
    for f in federations:
        check_federation(f, "Ditto")
    lams = first._lams()
    if not 0.0 <= first.validation_fraction < 1.0:
        raise InputError(f"validation_fraction must be in [0, 1), got {first.validation_fraction}")
    if first.validation_fraction == 0.0 and len(lams) > 1:
        raise InputError("choosing λ among several candidates needs validation_fraction > 0")
    cfgs = [m._config() for m in models]
    extra = (first.personal_steps, first.personal_lr, first.personal_optimizer)
    L = len(lams)
    if first.validation_fraction > 0:
        helds = [
            Federation(
                c.split(m.validation_fraction, generator(m.seed, "ditto-validation", k))
                for k, c in enumerate(f)
            )
            for m, f in zip(models, federations)
        ]
        for m, held, (w, personal, _) in zip(models, helds, _train(cfgs, helds, lams, *extra)):
            K = len(held)
            Xv = stack(held, "test")
            with torch.no_grad():
                pred = mlp_forward(personal, Xv.X.repeat(L, 1, 1), m.activation)
                mse = _mse(pred, Xv.y.repeat(L, 1), Xv.mask.repeat(L, 1)).reshape(L, K)
                gpred = mlp_forward([t.expand(K, *t.shape) for t in w], Xv.X, m.activation)
                gmse = _mse(gpred, Xv.y, Xv.mask)
            rmse = mse.sqrt().mean(1)
            best = int(torch.argmin(rmse))
            m.validation_ = pd.DataFrame({"lam": lams, "val_rmse_mean": rmse.numpy()})
            m.lam_ = lams[best]
            m.noise_variance_ = mse[best].numpy()
            m.global_noise_variance_ = float((Xv.weights * gmse).sum())
    else:
        for m in models:
            m.lam_ = lams[0]
    final = _train(cfgs, federations, [[m.lam_] for m in models], *extra)
    for m, f, (w, personal, history) in zip(models, federations, final):
        m.global_, m.personal_, m.federation_ = w, personal, f
        if m.validation_fraction == 0:
            m.noise_variance_ = _weighted_mse(personal, f, m.activation, True)
            train = _weighted_mse(w, f, m.activation, False)
            m.global_noise_variance_ = float(np.dot(f.weights.numpy(), train))
        m.history_ = _history(history)
    return list(models)
