"""``VariationalGPSpec``: a sparse variational GP (SVGP), federated as the FSGP scheme does.

A client's exact posterior costs O(n³); an SVGP (Hensman, Fusi & Lawrence 2013) summarises the
function by M inducing values u at locations Z, with q(u) = N(m, S), at O(n M²), and takes any
GPyTorch likelihood (Bernoulli for classification, Poisson for counts, Student-t for outliers)
through the evidence lower bound

    ELBO = Σ_i E_q(f_i)[log p(y_i | f_i)] − KL(q(u) ‖ p(u)).

What travels is what an exact GP's state holds, plus Z: the kernel, mean and likelihood
hyper-parameters and the inducing locations, averaged by the strategy (FedAvg in FGPR). q(u) is
each client's own and never leaves it, as the FSGP scheme keeps it: the variational counterpart of
FGPR conditioning the shared prior on a client's own rows. Clients hold nothing between rounds, so
a client fits its q(u) afresh, on all its rows, whenever it needs it (at the start of its local
steps, for its NLL and for prediction), by natural-gradient steps (GPyTorch's
``NaturalVariationalDistribution``). With a Gaussian likelihood one step of size 1 is exactly the
optimal q(u) of Titsias (2009); with any other likelihood the steps are damped and repeated until the
bound stops rising. During the local steps q(u) is held at that optimum while θ and Z move: at the
round's start the bound's gradient in θ is then exactly the gradient of the bound maximised over q
(Danskin's envelope theorem).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import gpytorch
import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.models.objective import exact_settings, log_prior
from fedgp.models.posterior import Prediction, prediction_metrics
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["VariationalGPSpec", "SparseVariationalGP"]

#: The part of a parameter's name that marks it as the client's own q(u).
PERSONAL = "variational_strategy._variational_distribution."
#: The shared inducing locations Z, (M, d).
INDUCING = "variational_strategy.inducing_points"
#: The damped natural-gradient step for a likelihood that is not Gaussian, and the change of the bound
#: per point below which a client's q(u) counts as fitted.
NON_CONJUGATE_STEP = 0.5
NON_CONJUGATE_TOLERANCE = 1e-8
#: The smallest damped step tried before a client's q(u) counts as at the bound's maximum.
MIN_STEP = 1.0 / 1024


class SparseVariationalGP(gpytorch.models.ApproximateGP):
    """GPyTorch's SVGP: whitened ``VariationalStrategy`` over M inducing points, q(u) in natural
    parameters (so that natural-gradient steps are plain steps), the likelihood as a submodule so
    that its hyper-parameters are named as an exact GP's (``likelihood.noise_covar.noise``)."""

    def __init__(self, mean_module, covar_module, likelihood, inducing_points: torch.Tensor, learn: bool):
        q = gpytorch.variational.NaturalVariationalDistribution(inducing_points.shape[-2])
        strategy = gpytorch.variational.VariationalStrategy(
            self, inducing_points, q, learn_inducing_locations=learn
        )
        super().__init__(strategy)
        self.mean_module, self.covar_module, self.likelihood = mean_module, covar_module, likelihood

    def forward(self, x) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _inducing_locations(inducing_points: int | torch.Tensor, input_dim: int | None) -> torch.Tensor:
    if isinstance(inducing_points, int) and not isinstance(inducing_points, bool):
        if inducing_points < 1 or input_dim is None or input_dim < 1:
            raise InputError(
                "VariationalGPSpec(inducing_points=M) needs M >= 1 and input_dim (the data's width), "
                f"got M={inducing_points!r}, input_dim={input_dim!r}; or give the locations as an (M, d) "
                "tensor"
            )
        # A scrambled Sobol set in the unit cube, where fit's default transforms put the inputs.
        sobol = torch.quasirandom.SobolEngine(input_dim, scramble=True, seed=0)
        return sobol.draw(inducing_points, dtype=torch.float64)
    Z = torch.as_tensor(inducing_points, dtype=torch.float64)
    if Z.ndim != 2 or Z.shape[0] < 1 or not bool(torch.isfinite(Z).all()):
        raise InputError(
            f"inducing_points must be an int M or a finite (M, d) tensor, got shape {tuple(Z.shape)}"
        )
    if input_dim is not None and Z.shape[1] != input_dim:
        raise InputError(f"inducing_points have {Z.shape[1]} columns but input_dim={input_dim}")
    return Z.clone()


class VariationalGPSpec(GPSpec):
    """A sparse variational GP: shared hyper-parameters and inducing locations, each client's own q(u).

    Args:
        inducing_points: M (with ``input_dim``: a scrambled Sobol set of M points in the unit cube,
            where ``fit``'s default input transform puts the data), or the (M, d) locations Z
            themselves, in the model's input units.
        kernel, mean: as :class:`~fedgp.models.spec.GPSpec`.
        likelihood: any one-output GPyTorch likelihood: ``GaussianLikelihood`` (default),
            ``BernoulliLikelihood`` (labels 0/1, probit link), ``PoissonLikelihood`` (counts),
            ``StudentTLikelihood``, ``LaplaceLikelihood``, ``BetaLikelihood``… A non-Gaussian
            likelihood sees the targets as they are: ``fit`` then standardises no outcome.
        input_dim: the inputs' width d, needed when ``inducing_points`` is an int.
        learn_inducing_locations: whether Z is trained (and averaged) or fixed where it starts.
        initial_values, fixed, dtype: as :class:`~fedgp.models.spec.GPSpec` (Z's state name is
            ``variational_strategy.inducing_points``).
        prior_weight: the weight of the modules' log priors in a client's per-point loss; ``None``:
            ``1 / n`` for a client of n rows, GPyTorch's ``VariationalELBO``.
        personal_steps: the most natural-gradient steps a client takes to fit its q(u); default 1
            for a Gaussian likelihood (exact), 100 otherwise (stopping once the bound per point
            changes by less than 1e-8).

    A client's local loss is the negative ELBO per point on a minibatch B of its n rows,
    ``−(Σ_{i∈B} E_q log p(y_i | f_i) / |B| − KL(q ‖ p) / n) − w log p(θ)``, with q(u) its own,
    fitted on all n rows at the round's start. Predictions are the likelihood's predictive:
    ``mean`` is E[y] (a class-1 probability for Bernoulli, an expected count for Poisson),
    ``variance_y`` Var[y], ``variance_f`` the variance of the latent f (Gauss–Hermite quadrature
    where there is no closed form).
    """

    def __init__(
        self,
        inducing_points: int | torch.Tensor,
        kernel: gpytorch.kernels.Kernel | str | None = None,
        mean: gpytorch.means.Mean | str | None = None,
        likelihood: gpytorch.likelihoods.Likelihood | None = None,
        *,
        input_dim: int | None = None,
        learn_inducing_locations: bool = True,
        initial_values: Mapping[str, float | torch.Tensor] | None = None,
        fixed: Iterable[str] = (),
        dtype: torch.dtype = torch.float64,
        prior_weight: float | None = None,
        personal_steps: int | None = None,
    ) -> None:
        self._Z = _inducing_locations(inducing_points, input_dim)
        self._learn = bool(learn_inducing_locations)
        super().__init__(
            kernel, mean, likelihood, input_dim=int(self._Z.shape[-1]), initial_values=initial_values,
            fixed=fixed, dtype=dtype, prior_weight=prior_weight,
        )  # fmt: skip
        default = 1 if self.conjugate else 100
        self.personal_steps = default if personal_steps is None else personal_steps
        steps = self.personal_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InputError(f"personal_steps must be an int >= 1, got {personal_steps!r}")

    # -- GPSpec's hooks ---------------------------------------------------------------------------
    def _check_likelihood(self, likelihood) -> None:
        if isinstance(likelihood, gpytorch.likelihoods.FixedNoiseGaussianLikelihood):
            raise InputTypeError(
                "VariationalGPSpec does not take a FixedNoiseGaussianLikelihood yet; use fedgp.GPSpec"
            )
        if not isinstance(likelihood, gpytorch.likelihoods.Likelihood):
            raise InputTypeError(f"likelihood must be a GPyTorch likelihood, got {type(likelihood).__name__}")

    def _make_template(self, mean, kernel, likelihood) -> SparseVariationalGP:
        return SparseVariationalGP(mean, kernel, likelihood, self._Z, self._learn)

    def _is_personal(self, raw_name: str) -> bool:
        return raw_name.startswith(PERSONAL)

    @property
    def variational(self) -> bool:
        """Always ``True``: each client fits its own q(u)."""
        return True

    @property
    def server_averaged(self) -> frozenset[str]:
        """The inducing locations: averaged as FSGP does, never stepped on by a server optimiser.
        FedAdam's per-coordinate steps (about ``lr`` whatever the gradient's size) turn the small,
        noisy pseudo-gradient of each of M·d coordinates into a random walk of the points: with
        M = 256 the test RMSE rose from 0.16 after 20 rounds to 0.26 after 160; with Z averaged it
        falls to 0.14 (``benchmarks/svgp_server_step.py``, 10 owners of 4,000 rows)."""
        return frozenset({INDUCING})

    @property
    def num_inducing(self) -> int:
        """M, the number of inducing points."""
        return int(self._Z.shape[0])

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The test metrics a client reports: RMSE, NLL and 95 % coverage (Gaussian), RMSE, log-loss
        as ``nll``, accuracy and Brier score (Bernoulli), RMSE and NLL (any other likelihood)."""
        if self.conjugate:
            return super().metric_names
        if isinstance(self.likelihood, gpytorch.likelihoods.BernoulliLikelihood):
            return ("rmse", "nll", "accuracy", "brier")
        return ("rmse", "nll")

    def check_input_dim(self, d: int, client: object = None) -> None:
        """As :meth:`GPSpec.check_input_dim`, and Z's width must be d too."""
        super().check_input_dim(d, client)
        if self.num_inducing and self._Z.shape[1] != d:
            whose = f"client {client!r} has" if client is not None else "the data have"
            raise InputError(
                f"variational_strategy.inducing_points have {self._Z.shape[1]} columns but {whose} {d} "
                f"input features; give inducing_points with {d} columns (or input_dim={d})"
            )

    def __repr__(self) -> str:
        return (
            f"VariationalGPSpec(M={self.num_inducing}, likelihood={type(self.likelihood).__name__}, "
            f"kernel={type(self.kernel).__name__}, params={list(self.names)})"
        )

    # -- a client's own q(u) ----------------------------------------------------------------------
    def _terms(self, model: SparseVariationalGP, X: torch.Tensor, y: torch.Tensor, num_data: int):
        """The bound's two terms per point: mean expected log-likelihood over the rows, KL / num_data."""
        f = model(X)
        ell = model.likelihood.expected_log_prob(y, f).sum(-1) / len(y)
        return ell, model.variational_strategy.kl_divergence() / num_data

    def fit_personal(self, model: SparseVariationalGP, X: torch.Tensor, y: torch.Tensor) -> float:
        """Fit the client's q(u) to all its rows under the model's current θ and Z; the bound per point.

        Starts from the (whitened) prior N(0, I), deterministically, and takes natural-gradient steps
        η ← η + ρ n ∇̃ (ELBO / n): ρ = 1 for a Gaussian likelihood (the exact optimum in one step),
        ρ = 0.5 otherwise, halved while a step would lower the bound or leave q(u) without a
        covariance (a likelihood that is not log-concave, such as Student-t's, can do that), until
        the bound per point changes by less than 1e-8 or ``personal_steps`` are taken."""
        strategy = model.variational_strategy
        q = strategy._variational_distribution
        with torch.no_grad():
            q.natural_vec.zero_()
            q.natural_mat.copy_(-0.5 * torch.eye(q.natural_mat.shape[-1], dtype=q.natural_mat.dtype))
            strategy.variational_params_initialized.fill_(1)
        model.train()
        n = len(y)
        with exact_settings():
            bound = self._bound(model, X, y, n)
            for _ in range(self.personal_steps):
                g_vec, g_mat = torch.autograd.grad(-bound, (q.natural_vec, q.natural_mat))
                start = (q.natural_vec.detach().clone(), q.natural_mat.detach().clone())
                step, better = (1.0 if self.conjugate else NON_CONJUGATE_STEP), None
                while step >= MIN_STEP and better is None:
                    with torch.no_grad():
                        q.natural_vec.copy_(start[0] - step * n * g_vec)
                        q.natural_mat.copy_(start[1] - step * n * g_mat)
                    if torch.linalg.cholesky_ex(-q.natural_mat.detach()).info == 0:
                        trial = self._bound(model, X, y, n)
                        if float(trial.detach()) >= float(bound.detach()) - NON_CONJUGATE_TOLERANCE:
                            better = trial
                    step /= 2
                if better is None:  # no step helps: q(u) is at the bound's maximum to round-off
                    with torch.no_grad():
                        q.natural_vec.copy_(start[0])
                        q.natural_mat.copy_(start[1])
                    break
                done = abs(float(better.detach()) - float(bound.detach())) < NON_CONJUGATE_TOLERANCE
                bound = better
                if done:
                    break
        strategy._clear_cache()
        return float(bound.detach())

    def _bound(self, model: SparseVariationalGP, X: torch.Tensor, y: torch.Tensor, n: int) -> torch.Tensor:
        ell, kl = self._terms(model, X, y, n)
        return ell - kl

    def minibatch_loss(
        self, model: SparseVariationalGP, X: torch.Tensor, y: torch.Tensor, num_data: int
    ) -> torch.Tensor:
        """The negative ELBO per point on the rows ``(X, y)`` of a client with ``num_data`` rows, minus
        the weighted log prior (differentiable in θ and Z; q(u) as the model holds it)."""
        model.train()
        with exact_settings():
            ell, kl = self._terms(model, X, y, num_data)
        weight = 1.0 / num_data if self.prior_weight is None else self.prior_weight
        return -(ell - kl + weight * log_prior(model))

    # -- prediction -------------------------------------------------------------------------------
    def predictive(
        self, model: SparseVariationalGP, X_new: torch.Tensor, full_cov: bool = False
    ) -> Prediction:
        """The likelihood's predictive at ``X_new`` under the model's θ, Z and q(u) (see the class)."""
        model.eval()
        model.variational_strategy._clear_cache()
        with torch.no_grad(), exact_settings():
            f = model(X_new)
            mean_f, var_f = f.mean, f.variance.clamp_min(0.0)
            covariance = f.covariance_matrix if full_cov else None
            if self.conjugate:
                mean_y, var_y = mean_f, model.likelihood(f).variance
            else:
                mean_y, var_y = _moments(model.likelihood, mean_f, var_f)
        return Prediction(mean_y, var_f, var_y, covariance, None if self.conjugate else mean_f)

    def test_metrics(
        self, predictions: Sequence[Prediction], targets: Sequence[torch.Tensor], states: HyperState
    ) -> dict[str, torch.Tensor]:
        """Each client's :attr:`metric_names` on its test targets; ``states`` (one per client) give the
        likelihood's own hyper-parameters (a Student-t's degrees of freedom) for the densities."""
        if self.conjugate:
            return prediction_metrics(predictions, targets)
        names = self.metric_names
        out = {name: torch.empty(len(predictions), dtype=torch.float64) for name in names}
        model = self.build()
        for i, (p, y) in enumerate(zip(predictions, targets)):
            self.load(model, states.index(i))
            y = y.to(p.mean.dtype)
            values = _scores(model.likelihood, p, y)
            for name in names:
                out[name][i] = values[name]
        return out


def _moments(likelihood, mean_f: torch.Tensor, var_f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E[y] and Var[y] under ∫ p(y | f) N(f; mean_f, var_f) df: exact for Bernoulli (probit),
    Gauss–Hermite quadrature (GPyTorch's, 20 nodes) for the others."""
    f = gpytorch.distributions.MultivariateNormal(mean_f, torch.diag_embed(var_f))
    if isinstance(likelihood, gpytorch.likelihoods.BernoulliLikelihood):
        p = likelihood.marginal(f).probs
        return p, p * (1 - p)
    first = likelihood.quadrature(lambda s: likelihood.forward(s).mean, f)
    second = likelihood.quadrature(lambda s: _second_moment(likelihood.forward(s)), f)
    return first, (second - first**2).clamp_min(0.0)


def _second_moment(dist: torch.distributions.Distribution) -> torch.Tensor:
    return dist.variance + dist.mean**2


def _scores(likelihood, p: Prediction, y: torch.Tensor) -> dict[str, float]:
    """Test metrics of one client's non-Gaussian predictive against its targets."""
    out = {"rmse": float(((p.mean - y) ** 2).mean().sqrt())}
    if isinstance(likelihood, gpytorch.likelihoods.BernoulliLikelihood):
        prob = p.mean.clamp(1e-12, 1 - 1e-12)
        out["nll"] = float(-(y * prob.log() + (1 - y) * (1 - prob).log()).mean())
        out["accuracy"] = float(((prob > 0.5).to(y.dtype) == y).to(torch.float64).mean())
        out["brier"] = float(((p.mean - y) ** 2).mean())
        return out
    f = gpytorch.distributions.MultivariateNormal(p.latent_mean, torch.diag_embed(p.variance_f))
    with torch.no_grad():
        out["nll"] = float(-likelihood.log_marginal(y, f).mean())
    return out
