"""The multi-fidelity deep GP (MF-DGP) of Cutajar et al. (2019), on GPyTorch's deep GP module.

One :class:`gpytorch.models.deep_gps.DeepGPLayer` per fidelity, lowest first. Layer 0 is a sparse
variational GP on ``x``; layer ``t ≥ 1`` is one on ``z = [x, f_{t-1}(x)]`` with the kernel
``k_ρ(x) · (k_f(f) + linear(f)) + k_δ(x)`` (RBF, ARD over ``x``; emukit's ``make_mf_dgp``), so the
map from one fidelity to the next may be nonlinear and vary with ``x``. Level ``t``'s observations
are explained by layer ``t`` with its own Gaussian noise: the evidence lower bound sums every
level's expected log-likelihood, computed by pushing ``samples`` draws through the layers below
(the doubly stochastic scheme of Salimbeni & Deisenroth 2017: each point's marginal sampled
independently), minus every layer's KL divergence. Prediction pushes ``predict_samples`` draws
through the layers and matches moments, as emukit's ``MultiFidelityDeepGP.predict`` does.

The reference design is emukit's (``emukit/examples/multi_fidelity_dgp``, on TensorFlow 1 and
GPflow 1, no longer installable), followed in:

* zero mean functions; unwhitened variational distributions (``q(u)`` over function values at the
  inducing inputs, so that they can start at the data);
* inducing inputs at the data, held fixed: layer 0 at the lowest level's inputs, layer ``t`` at
  the level below's ``[X_{t-1}, y_{t-1}]`` (every ``inducing_stride``-th point; emukit: every other);
* the multi-step training: Adam with the top level's noise fixed at 1 % of its output variance,
  the variational covariances fixed (inner layers tiny, the top layer at 1 % of its prior's
  Cholesky factor) and the inner layers' variational means fixed at the data; then the noise and
  the covariances freed; then the inner means freed too (:func:`emukit_stages`).

Where it departs: the inner levels' noise is a per-level Gaussian likelihood (emukit adds a white
kernel to the inner layers and uses its variance as the noise, so its propagated samples carry the
noise too); the unit-cube inputs start with lengthscale 0.2 (emukit: 1); the stages are
parameters, shorter by default than emukit's 5,000 + 15,000 + 15,000 steps (``results/README.md``
gives what the default costs and reaches).

``fit_batch`` trains several independent problems of the same sizes (e.g. the repeats of a study)
as one batched tensor program: each problem has its own parameters, data and Monte Carlo draws
(from its own seed), and Adam acts on each parameter element by element, so every problem's fit is
the one it would get alone (to about 1e-5: GPyTorch adds its Cholesky jitter to a whole batch when
one matrix needs it), while GPyTorch's per-call overhead is paid once for the batch.

Why by hand at all: no maintained PyTorch library ships MF-DGP; GPyTorch supplies the layers, the
variational strategies and the KL terms, and this module wires them as Cutajar et al. do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.models.deep_gps import DeepGP, DeepGPLayer
from linear_operator import to_dense

from fedgp.errors import InputError, MLEError, NotFittedError
from fedgp.models.multifidelity import _as_inputs, _check_levels, mle_with_restarts
from fedgp.models.posterior import Prediction, condition
from fedgp.models.spec import GPSpec

__all__ = ["MFDGP", "Stage", "emukit_stages"]

Levels = Sequence[tuple[torch.Tensor, torch.Tensor]]
# Restarts of a level's exact-GP start when its default and interpolating starts both fail
# (NARGP's default number), and the lengthscale floor of the last try (NARGP's).
FALLBACK_RESTARTS = 4
FALLBACK_FLOOR = 1e-4
# The raw value a start's zero variance takes instead of -inf (softplus(-20) = 2e-9).
RAW_FLOOR = -20.0


@dataclass(frozen=True)
class Stage:
    """One stage of the training: ``iterations`` Adam steps at ``lr``, and which groups move."""

    iterations: int
    lr: float
    free_noise: bool
    free_covariance: bool
    free_inner_means: bool

    def __post_init__(self) -> None:
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or self.iterations < 0:
            raise InputError(f"Stage: iterations must be an integer >= 0, got {self.iterations!r}")
        if not self.lr > 0:
            raise InputError(f"Stage: lr must be > 0, got {self.lr!r}")


def emukit_stages(scale: float = 1.0) -> tuple[Stage, ...]:
    """emukit's schedule, each stage's length times ``scale``: 5,000 steps at lr 3e-3 with the top
    noise, the covariances and the inner means fixed; 15,000 at 1e-3 with the noise and the
    covariances free; 15,000 at 1e-3 with everything free."""
    if not scale > 0:
        raise InputError(f"emukit_stages: scale must be > 0, got {scale!r}")
    n = lambda k: max(1, int(round(k * scale)))  # noqa: E731
    return (
        Stage(n(5000), 3e-3, False, False, False),
        Stage(n(15000), 1e-3, True, True, False),
        Stage(n(15000), 1e-3, True, True, True),
    )


class _FidelityLayer(DeepGPLayer):
    """A sparse variational GP (unwhitened, zero mean) with fixed inducing inputs ``Z``
    ``(batch, m, D)`` and the given kernel."""

    def __init__(self, Z: torch.Tensor, kernel: gpytorch.kernels.Kernel) -> None:
        q = gpytorch.variational.CholeskyVariationalDistribution(Z.shape[-2], batch_shape=Z.shape[:-2])
        strategy = gpytorch.variational.UnwhitenedVariationalStrategy(
            self, Z, q, learn_inducing_locations=False
        )
        super().__init__(strategy, Z.shape[-1], None)
        self.mean_module = gpytorch.means.ZeroMean(batch_shape=Z.shape[:-2])
        self.covar_module = kernel

    def forward(self, x: torch.Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _lengthscale(floor: float | None) -> dict:
    return {} if floor is None else {"lengthscale_constraint": gpytorch.constraints.GreaterThan(floor)}


def _x_kernel(d: int, batch: torch.Size, floor: float | None = None) -> gpytorch.kernels.Kernel:
    rbf = gpytorch.kernels.RBFKernel(
        ard_num_dims=d, active_dims=tuple(range(d)), batch_shape=batch, **_lengthscale(floor)
    )
    return gpytorch.kernels.ScaleKernel(rbf, batch_shape=batch)


class _DenseSum(gpytorch.kernels.AdditiveKernel):
    """gpytorch's AdditiveKernel, its terms added as dense tensors.

    On square blocks gpytorch adds a LinearKernel as a low-rank update (a root decomposition and
    an SVD of the other term per batch entry); the link kernel's blocks are small, so dense tensors
    give the same entries in a third of the kernel's time. MF-DGP's prediction pushes 250 samples x
    repeats x points through it: 2.4x faster at half the peak memory (benchmarks/mfdgp_predict.py)."""

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params) -> torch.Tensor:
        return sum(to_dense(k(x1, x2, diag=diag, **params)) for k in self.kernels)


class _DenseProduct(gpytorch.kernels.ProductKernel):
    """gpytorch's ProductKernel, its factors multiplied as dense tensors (on square blocks gpytorch
    builds a MulLinearOperator, which takes a root decomposition of every factor; see _DenseSum)."""

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params) -> torch.Tensor:
        out = to_dense(self.kernels[0](x1, x2, diag=diag, **params))
        for k in self.kernels[1:]:
            out = out * to_dense(k(x1, x2, diag=diag, **params))
        return out


def _link_kernel(d: int, batch: torch.Size, floor: float | None = None) -> gpytorch.kernels.Kernel:
    """``k_ρ(x) · (k_f(f) + linear(f)) + k_δ(x)`` on ``z = [x, f]`` (emukit, ``add_linear=True``);
    ``floor``: a lower bound on every lengthscale (the exact-GP start's last try). Built as
    ``k_ρ * (k_f + linear) + k_δ`` would be (same parameter names), evaluated dense."""
    rbf = gpytorch.kernels.RBFKernel(active_dims=(d,), batch_shape=batch, **_lengthscale(floor))
    k_f = gpytorch.kernels.ScaleKernel(rbf, batch_shape=batch)
    linear = gpytorch.kernels.LinearKernel(active_dims=(d,), batch_shape=batch)
    k_rho, k_delta = _x_kernel(d, batch, floor), _x_kernel(d, batch, floor)
    return _DenseSum(_DenseProduct(k_rho, _DenseSum(k_f, linear)), k_delta)


def _posterior_mean(spec: GPSpec, state, inputs: torch.Tensor, y: torch.Tensor, below):
    """``X -> μ_t(X)``: the exact GP of level ``t`` (on ``[x, μ_{t-1}(x)]`` when ``below`` is given)."""

    def mean(X: torch.Tensor) -> torch.Tensor:
        Z = X if below is None else torch.cat([X, below(X)[:, None]], 1)
        return condition(spec, state, inputs, y, Z).mean

    return mean


class _Network(DeepGP):
    """The layers, one Gaussian likelihood per level, and the sampling through the layers."""

    def __init__(self, layers: list[_FidelityLayer], batch: torch.Size, noise_floor: float) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.likelihoods = torch.nn.ModuleList(
            gpytorch.likelihoods.GaussianLikelihood(
                batch_shape=batch, noise_constraint=gpytorch.constraints.GreaterThan(noise_floor)
            )
            for _ in layers
        )

    def kl(self) -> list[torch.Tensor]:
        """KL(q(u_t) || p(u_t)) of every layer, ``(batch,)`` each.

        Computed here rather than by ``UnwhitenedVariationalStrategy.kl_divergence``: that one
        reuses the prior it cached in the layer's last call, which carries the Monte Carlo sample
        dimension of that call's inputs (so summing it would count the KL once per sample)."""
        out = []
        for layer in self.layers:
            strategy = layer.variational_strategy
            prior = layer.forward(strategy.inducing_points)
            prior = MultivariateNormal(prior.mean, prior.lazy_covariance_matrix.add_jitter())
            out.append(torch.distributions.kl_divergence(strategy.variational_distribution, prior))
        return out

    def propagate(self, Xs: Sequence[torch.Tensor], samples: int, gens: Sequence[torch.Generator]):
        """Marginal means and variances of layer ``t`` at ``Xs[t]`` ``(batch, n_t, d)`` for every
        ``t < len(Xs)``, each ``(samples, batch, n_t)``.

        Every layer is called once, on the inputs of its own level and of the levels above: layer 0
        on ``x`` (no sampling needed), layer ``t ≥ 1`` on ``[x, f_{t-1}]`` with ``f_{t-1}`` one draw
        of layer ``t - 1``'s marginal per point and sample, problem ``b`` drawing from ``gens[b]``."""
        sizes = [X.shape[-2] for X in Xs]
        inputs = torch.cat(list(Xs), -2)
        means, variances = [], []
        for t in range(len(Xs)):
            out = self.layers[t](inputs, are_samples=True)
            mean, var = out.mean, out.variance.clamp_min(1e-12)
            if t == 0:
                mean, var = mean.expand(samples, *mean.shape), var.expand(samples, *var.shape)
            means.append(mean[..., : sizes[t]])
            variances.append(var[..., : sizes[t]])
            if t + 1 < len(Xs):
                mean, var = mean[..., sizes[t] :], var[..., sizes[t] :]
                eps = torch.stack(
                    [torch.randn(samples, mean.shape[-1], generator=g, dtype=mean.dtype) for g in gens], 1
                ).to(mean.device)
                above = torch.cat(list(Xs[t + 1 :]), -2).expand(samples, *mean.shape[1:], -1)
                inputs = torch.cat([above, (mean + var.sqrt() * eps).unsqueeze(-1)], -1)
        return means, variances


class MFDGP:
    """Multi-fidelity deep GP (Cutajar et al. 2019), centralised: it sees every level's data.

    Args:
        stages: the training schedule (:class:`Stage`); default :func:`emukit_stages` scaled by
            ``0.2`` (1,000 + 3,000 + 3,000 Adam steps).
        samples: Monte Carlo draws per point in the bound (emukit: 10).
        predict_samples: draws per point at prediction (emukit: 250).
        inducing_stride: layer ``t ≥ 1`` takes every ``inducing_stride``-th point of the level
            below as an inducing input (emukit: 2).
        low_inducing_stride: layer 0 takes every ``low_inducing_stride``-th point of the lowest
            level (emukit: 1, every point; its share of a step's cost falls about with the stride's cube).
        noise_floor: the smallest noise variance of any level (the test functions are noise-free).
        top_noise: the top level's starting noise as a share of its output variance (emukit: 0.01,
            held there by the first stage); ``None`` starts it at the exact-GP start's fitted noise.
            From 0.01 Adam cannot bring it much below 7e-4 in Table 1's 400 free steps, which is
            what held MF-DGP back on the nearly noiseless PARK (benchmarks/mfdgp_top_noise.py).
        start_iterations: L-BFGS iterations of each exact-GP fit that the training starts from
            (:meth:`_exact_start`).
        device: where the training and prediction run (e.g. ``"cuda"``; default the CPU). The
            exact-GP fits it starts from run on the CPU; predictions come back on the CPU.
        seed: seeds the Monte Carlo draws (problem ``b`` of :meth:`fit_batch` uses ``seed + b``
            unless ``seeds`` are given).

    ``fit(levels)`` takes ``[(X_low, y_low), ..., (X_high, y_high)]`` (lowest first; outputs on a
    unit scale, e.g. standardised). After fitting: ``elbo_`` (the bound per point at the end of each
    stage, one list per problem), ``history_`` (the mean negative bound per point every 100 steps)
    and ``seconds_`` (training time).
    """

    def __init__(
        self,
        stages: Sequence[Stage] | None = None,
        samples: int = 10,
        predict_samples: int = 250,
        inducing_stride: int = 2,
        low_inducing_stride: int = 1,
        noise_floor: float = 1e-6,
        top_noise: float | None = 0.01,
        start_iterations: int = 200,
        seed: int = 0,
        device: str | torch.device | None = None,
    ) -> None:
        self.stages = tuple(emukit_stages(0.2) if stages is None else stages)
        if not self.stages or not all(isinstance(s, Stage) for s in self.stages):
            raise InputError("MFDGP: stages must be a non-empty sequence of fedgp.baselines.mfdgp.Stage")
        for name, value in (("samples", samples), ("predict_samples", predict_samples)):
            if value < 1:
                raise InputError(f"MFDGP: {name} must be >= 1, got {value}")
        if inducing_stride < 1 or low_inducing_stride < 1:
            raise InputError(
                f"MFDGP: inducing strides must be >= 1, got {inducing_stride} and {low_inducing_stride}"
            )
        self.low_inducing_stride = low_inducing_stride
        if not noise_floor > 0:
            raise InputError(f"MFDGP: noise_floor must be > 0, got {noise_floor}")
        if top_noise is not None and not top_noise > 0:
            raise InputError(f"MFDGP: top_noise must be > 0 or None, got {top_noise}")
        self.top_noise = top_noise
        if start_iterations < 1:
            raise InputError(f"MFDGP: start_iterations must be >= 1, got {start_iterations}")
        self.start_iterations = start_iterations
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.samples, self.predict_samples = samples, predict_samples
        self.inducing_stride, self.noise_floor, self.seed = inducing_stride, noise_floor, seed

    # -- building ---------------------------------------------------------------------------------
    def _build(self) -> _Network:
        batch = torch.Size([self.batch_])
        d = self.d_
        Xs = [X for X, _ in self.stacked_]
        ys = [y for _, y in self.stacked_]
        layers = [_FidelityLayer(Xs[0][:, :: self.low_inducing_stride], _x_kernel(d, batch))]
        for t in range(1, len(Xs)):
            Z = torch.cat([Xs[t - 1], ys[t - 1].unsqueeze(-1)], -1)[:, :: self.inducing_stride]
            layers.append(_FidelityLayer(Z, _link_kernel(d, batch)))
        net = _Network(layers, batch, self.noise_floor).to(torch.float64)
        start = self._exact_start([layer.variational_strategy.inducing_points for layer in layers])
        top_var = ys[-1].var(-1)  # (batch,)
        with torch.no_grad():
            for t, layer in enumerate(layers):
                fitted = [dict(kernel.named_parameters()) for kernel, _, _ in start[t]]
                for name, param in layer.covar_module.named_parameters():
                    for b, values in enumerate(fitted):
                        # A variance the start fitted to exactly 0 (BRANIN's middle level drops the
                        # linear term) is raw -inf: its gradient would be NaN from the first step.
                        raw = torch.nan_to_num(values[name], neginf=RAW_FLOOR)
                        param[b] = raw.reshape(param[b].shape)
                strategy = layer.variational_strategy
                q = strategy._variational_distribution
                q.variational_mean.copy_(torch.stack([mean for _, _, mean in start[t]]))
                L = torch.linalg.cholesky(strategy.prior_distribution.covariance_matrix)
                top = t == len(layers) - 1
                scale = 0.01 * top_var if top else torch.full_like(top_var, 1e-4)
                q.chol_variational_covar.copy_(L * scale[:, None, None])
                strategy.variational_params_initialized.fill_(1)
                noise = torch.stack([noise for _, noise, _ in start[t]])
                if top and self.top_noise is not None:  # a share of the variance (emukit: 1 %)
                    noise = self.top_noise * top_var
                net.likelihoods[t].noise = noise.clamp_min(self.noise_floor)[:, None]
        return net

    def _exact_start(self, inducing: list[torch.Tensor]) -> list[list[tuple]]:
        """Where the training starts: per level ``t`` and problem ``b``, ``(kernel, noise, mean)`` of
        an exact GP fitted by type-II ML to level ``t``'s data, with layer ``t``'s kernel, on the
        inputs ``[x, μ_{t-1}(x)]`` (``μ_{t-1}``: the same fit one level down; NARGP's recursion), and
        its posterior mean at the layer's inducing inputs.

        emukit starts from unit hyper-parameters, the top layer's variational mean at zero, and
        trains 35,000 Adam steps. With a few thousand steps that start ended at the HF-only GP's
        optimum (the top layer's ``k_δ(x)`` explaining the HF data by itself) on 4 of 5 draws of the
        nonlinear example; started here, the variational training begins where NARGP's
        point-estimate fit ends and adds the propagation of the lower levels' uncertainty."""
        d = self.d_
        out: list[list[tuple]] = [[] for _ in inducing]
        for b, levels in enumerate(self.levels_):
            below = None
            for t, (X, y) in enumerate(levels):
                kernel = _x_kernel if t == 0 else _link_kernel
                spec = GPSpec(kernel=kernel(d, torch.Size()))
                inputs = X if t == 0 else torch.cat([X, below(X)[:, None]], 1)
                # Tried in turn until one fits: the default and interpolating starts; with NARGP's
                # 4 restarts (BRANIN's middle level, 1 draw in 30); and with NARGP's lengthscale
                # floor too (Borehole's HF level on [x, f]: L-BFGS drives a lengthscale to 0 and
                # the likelihood to NaN). The state is then read in the layers' own parameters.
                tries = ((spec, 1), (spec, FALLBACK_RESTARTS))
                tries += ((GPSpec(kernel=kernel(d, torch.Size(), FALLBACK_FLOOR)), FALLBACK_RESTARTS),)
                for i, (fit_spec, restarts) in enumerate(tries):
                    try:
                        state, _ = mle_with_restarts(
                            fit_spec,
                            [(inputs, y)],
                            restarts=restarts,
                            seed=self.seeds_[b] + 1000 * t,
                            max_iter=self.start_iterations,
                        )
                        break
                    except MLEError:
                        if i == len(tries) - 1:
                            raise
                model = spec.build()
                spec.load(model, state)
                mean = condition(spec, state, inputs, y, inducing[t][b]).mean
                out[t].append((model.covar_module, state["likelihood.noise_covar.noise"].reshape(()), mean))
                below = _posterior_mean(spec, state, inputs, y, below)
        return out

    @staticmethod
    def _trained(net: _Network, stage: Stage) -> list[torch.nn.Parameter]:
        """The parameters ``stage`` trains (kernels and inner noises always)."""
        fixed: set[int] = set()
        if not stage.free_noise:
            fixed.add(id(net.likelihoods[-1].raw_noise))
        last = len(net.layers) - 1
        for t, layer in enumerate(net.layers):
            q = layer.variational_strategy._variational_distribution
            if not stage.free_covariance:
                fixed.add(id(q.chol_variational_covar))
            if not stage.free_inner_means and 0 < t < last:
                fixed.add(id(q.variational_mean))
        return [p for p in net.parameters() if id(p) not in fixed]

    def _negative_elbo(self, net: _Network) -> torch.Tensor:
        """The negative bound per point, one value per problem ``(batch,)``."""
        means, variances = net.propagate([X for X, _ in self.stacked_], self.samples, self.gens_)
        total = 0.0
        n = 0
        for t, (_, y) in enumerate(self.stacked_):
            noise = net.likelihoods[t].noise  # (batch, 1)
            # E_q[log N(y | f, σ²)] for f ~ N(mean, var), averaged over the samples
            ell = -0.5 * (torch.log(2 * torch.pi * noise) + ((y - means[t]) ** 2 + variances[t]) / noise)
            total = total + ell.mean(0).sum(-1)
            n += y.shape[-1]
        return -(total - sum(net.kl())) / n

    # -- public -----------------------------------------------------------------------------------
    def fit(self, levels: Levels) -> MFDGP:
        """Fit on ``[(X_low, y_low), ..., (X_high, y_high)]`` (lowest fidelity first)."""
        return self.fit_batch([levels])

    def fit_batch(self, problems: Sequence[Levels], seeds: Sequence[int] | None = None) -> MFDGP:
        """Fit independent problems of the same shape at once (see the module docstring).

        ``problems``: each a list of levels as :meth:`fit` takes, every problem with the same number
        of levels, points per level and inputs. ``seeds``: one per problem (default ``seed + b``).
        Predict with :meth:`predict_batch` (or :meth:`predict` when there is one problem).
        """
        if not problems:
            raise InputError("MFDGP.fit_batch: give at least one problem")
        checked = [_check_levels(levels) for levels in problems]
        shape = [tuple(X.shape) for X, _ in checked[0]]
        for b, levels in enumerate(checked[1:], 1):
            if [tuple(X.shape) for X, _ in levels] != shape:
                raise InputError(
                    f"MFDGP.fit_batch: problem {b} has level shapes {[tuple(X.shape) for X, _ in levels]}, "
                    f"problem 0 has {shape}; a batch needs the same sizes"
                )
        for b, levels in enumerate(checked):
            for t, (X, _) in enumerate(levels[:-1]):
                if X.shape[0] < 2 * self.inducing_stride:
                    raise InputError(
                        f"MFDGP: problem {b} level {t} has {X.shape[0]} points, too few for "
                        f"inducing_stride {self.inducing_stride}"
                    )
        seeds = [self.seed + b for b in range(len(checked))] if seeds is None else [int(s) for s in seeds]
        if len(seeds) != len(checked):
            raise InputError(f"MFDGP.fit_batch: {len(checked)} problems but {len(seeds)} seeds")
        self.batch_ = len(checked)
        self.d_ = shape[0][1]
        self.levels_ = checked
        self.stacked_ = [
            (torch.stack([p[t][0] for p in checked]), torch.stack([p[t][1] for p in checked]))
            for t in range(len(shape))
        ]
        self.seeds_ = seeds
        self.gens_ = [torch.Generator().manual_seed(s) for s in seeds]
        start = time.perf_counter()
        net = self._build().to(self.device)
        self.stacked_ = [(X.to(self.device), y.to(self.device)) for X, y in self.stacked_]
        self.history_: list[float] = []
        elbo = []
        step = 0
        for stage in self.stages:
            if stage.iterations == 0:
                continue
            optimizer = torch.optim.Adam(self._trained(net, stage), lr=stage.lr)
            for _ in range(stage.iterations):
                optimizer.zero_grad()
                loss = self._negative_elbo(net)
                loss.sum().backward()
                optimizer.step()
                if step % 100 == 0:
                    self.history_.append(float(loss.detach().mean()))
                step += 1
            with torch.no_grad():
                elbo.append((-self._negative_elbo(net)).tolist())
        self.elbo_ = [list(values) for values in zip(*elbo)]
        self.net_ = net
        self.seconds_ = time.perf_counter() - start
        return self

    def predict_batch(self, Xs: Sequence, level: int = -1, chunk: int | None = None) -> list[Prediction]:
        """Moment-matched predictive distributions of level ``level`` (default the highest), problem
        ``b`` at ``Xs[b]`` (every ``Xs[b]`` with the same number of rows).

        ``chunk``: test points per pass. Each layer's pass holds ``predict_samples x problems``
        kernel blocks of ``(m + chunk)²`` entries (``m`` inducing points), so memory grows with it
        and time per point falls (PARK, 30 problems, ``m`` = 150, one core: 1.2 s per point and
        6.2 GB peak at the default 17, 0.22 s and 10.3 GB at 200; benchmarks/mfdgp_predict.py).
        The Monte Carlo draws are taken chunk by chunk, so another ``chunk`` gives other draws: the
        same distribution, not the same numbers."""
        if not hasattr(self, "net_"):
            raise NotFittedError("MFDGP is not fitted yet; call fit(levels) first")
        if len(Xs) != self.batch_:
            raise InputError(f"MFDGP.predict_batch: {self.batch_} problems were fitted, got {len(Xs)} inputs")
        X = torch.stack([_as_inputs(x, self.d_) for x in Xs]).to(self.device)
        t = range(len(self.levels_[0]))[level]
        if chunk is None:  # about 2e7 kernel entries a pass; the chunks fix the draws of Table 1's rows
            m = max(layer.variational_strategy.inducing_points.shape[-2] for layer in self.net_.layers)
            chunk = max(1, int(2e7 // (self.predict_samples * self.batch_ * m)))
        gens = [torch.Generator().manual_seed(s + 7919) for s in self.seeds_]
        parts = []
        with torch.no_grad():
            for start in range(0, X.shape[1], chunk):
                Xc = X[:, start : start + chunk]
                # only level t's rows: the levels below get none
                means, variances = self.net_.propagate([Xc[:, :0]] * t + [Xc], self.predict_samples, gens)
                mean, var = means[t], variances[t]
                parts.append((mean.mean(0), var.mean(0) + mean.var(0, unbiased=False)))
        mean, var_f = (torch.cat(p, -1) for p in zip(*parts))
        mean, var_f = mean.cpu(), var_f.cpu()
        noise = self.net_.likelihoods[t].noise.detach().cpu()  # (batch, 1)
        return [Prediction(mean[b], var_f[b], var_f[b] + noise[b]) for b in range(self.batch_)]

    def predict(self, X, level: int = -1) -> Prediction:
        """Moment-matched predictive distribution of level ``level`` (default the highest) at ``X``."""
        if hasattr(self, "net_") and self.batch_ != 1:
            raise InputError(f"MFDGP.predict: {self.batch_} problems were fitted; use predict_batch")
        return self.predict_batch([X], level)[0]
