"""``GPSpec``: a GP model made of GPyTorch modules, and the map between modules and states.

A spec is a template. It holds the user's mean, kernel and likelihood (any GPyTorch modules),
copied so that training never mutates the user's objects, and knows every hyper-parameter:
its GPyTorch raw parameter, its constraint, its shape and whether it is trained. Engines build
models from it; strategies only ever see :class:`~fedgp.models.state.HyperState` values.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import gpytorch
import torch

from fedgp import defaults
from fedgp.errors import InputError, InputTypeError, UnknownNameError
from fedgp.models.named import make_kernel, make_mean, needs_width
from fedgp.models.state import HyperState

__all__ = ["GPSpec", "ParamInfo", "ZeroKernel", "ExactGPModel"]


class ZeroKernel(gpytorch.kernels.Kernel):
    """The zero covariance: with it the GP is its mean function plus Gaussian noise.

    A linear mean with this kernel is exactly linear regression with Gaussian noise, the model of
    the mixed-regression papers. (A ``ScaleKernel`` cannot stand in: its softplus-constrained
    outputscale never reaches zero.)
    """

    has_lengthscale = False

    def forward(self, x1, x2, diag=False, last_dim_is_batch=False, **params) -> torch.Tensor:
        if diag:
            return torch.zeros(*x1.shape[:-1], dtype=x1.dtype, device=x1.device)
        return torch.zeros(*x1.shape[:-1], x2.shape[-2], dtype=x1.dtype, device=x1.device)


class ExactGPModel(gpytorch.models.ExactGP):
    """The textbook GPyTorch exact GP: ``MultivariateNormal(mean(x), kernel(x))``."""

    def __init__(self, mean_module, covar_module, likelihood):
        super().__init__(None, None, likelihood)
        self.mean_module = mean_module
        self.covar_module = covar_module

    def forward(self, x) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


#: State names of GPyTorch's common modules in :class:`ExactGPModel` (``likelihood``, ``mean_module``,
#: ``covar_module``): a ``GaussianLikelihood``'s noise, a ``ScaleKernel``'s outputscale and its base
#: kernel's lengthscale, a ``ConstantMean``'s constant (``raw_constant``: it has no constraint), a
#: ``LinearMean``'s weights and bias. The data transforms know how each maps to the data's units
#: (:func:`fedgp.models.units.state_in_units`).
NOISE = "likelihood.noise_covar.noise"
OUTPUTSCALE = "covar_module.outputscale"
LENGTHSCALE = "covar_module.base_kernel.lengthscale"
CONSTANT = "mean_module.raw_constant"
WEIGHTS = "mean_module.weights"
BIAS = "mean_module.bias"


@dataclass(frozen=True)
class ParamInfo:
    """One hyper-parameter: its state name, GPyTorch raw parameter name, constraint, shape."""

    name: str
    raw_name: str
    shape: torch.Size
    constraint: gpytorch.constraints.Interval | None
    trainable: bool

    def transform(self, raw: torch.Tensor) -> torch.Tensor:
        """Constrained value from a raw one (the constraint's transform; none without a constraint)."""
        return raw if self.constraint is None else self.constraint.transform(raw)

    def inverse_transform(self, value: torch.Tensor) -> torch.Tensor:
        """Raw value from a constrained one.

        A value on the constraint's bound (a softplus that underflowed: a lengthscale of exactly 0,
        a noise exactly at its floor) is read as the nearest value inside it, whose raw value is
        finite (about -745 for a bound of 0): GPyTorch's inverse gives -inf there, and one such
        client made the server's raw average -inf or NaN."""
        if self.constraint is None:
            return value
        low = torch.as_tensor(self.constraint.lower_bound, dtype=value.dtype)
        high = torch.as_tensor(self.constraint.upper_bound, dtype=value.dtype)
        inside = torch.minimum(torch.maximum(value, torch.nextafter(low, high)), torch.nextafter(high, low))
        return self.constraint.inverse_transform(inside)


def _check_module(kind: str, module, cls: type, example: str) -> None:
    if not isinstance(module, (cls, str)):
        raise InputTypeError(
            f"{kind} must be a GPyTorch {kind} (e.g. {example}) or a name, got {type(module).__name__}"
        )


def _state_name(raw_name: str, constrained: bool) -> str:
    head, _, last = raw_name.rpartition(".")
    if constrained and last.startswith("raw_"):
        last = last[len("raw_") :]
    return f"{head}.{last}" if head else last


class GPSpec:
    """A GP prior and likelihood, specified with GPyTorch modules.

    Args:
        kernel: any GPyTorch kernel, or a name: ``"rbf"`` (default), ``"matern12"``, ``"matern32"``,
            ``"matern52"``, each inside a ``ScaleKernel`` with one lengthscale per input feature
            (``ard``). A named kernel is built for the data's width when it is known: ``fit`` calls
            :meth:`for_inputs` with the federation's number of features (so ``GPSpec()`` fits a
            table of any width; until then the spec shows a one-feature placeholder).
        mean: any GPyTorch mean, or a name: ``"zero"`` (default: ``fit``'s default transforms
            standardise the targets), ``"constant"``, ``"linear"``.
            The defaults are fedgp's one set (:mod:`fedgp.defaults`), the same in every door: the
            scikit-learn estimator, ``fedgp fit`` and the Flower app. The FGPR paper's prior,
            ``ScaleKernel(RBFKernel())`` with ``ZeroMean()``, is written out as modules.
        likelihood: default ``GaussianLikelihood()`` (noise >= 1e-4, GPyTorch's default).
        ard: for a kernel given by name: one lengthscale per input feature (default) or one shared.
        input_dim: the inputs' width d for modules given by name (``None``: sized by ``fit``).
        initial_values: constrained starting values by state name, e.g.
            ``{"likelihood.noise_covar.noise": 10.0}``; default GPyTorch's (softplus(0) = 0.693).
        fixed: state names that are never trained (they still travel in the state). Parameters
            whose ``requires_grad`` is already ``False`` are fixed too.
        dtype: float64 by default: exact GP marginal likelihoods on small minibatches are
            ill-conditioned in float32. ``torch.float32`` works on every engine: the models
            compute in it, Cholesky jitter follows GPyTorch's float32 schedule (1e-6, 1e-5, 1e-4
            instead of 1e-8, 1e-7, 1e-6), and the server averages states in it. States cross the
            wire as float64 (records carry float64 only; float32 → float64 → float32 is exact).
        prior_weight: how the log prior of the modules' GPyTorch priors enters a client's per-point
            loss ``-log p(y_ξ | θ) / M - w log p(θ)``. ``None`` (default): ``w = 1 / M`` for a
            minibatch of M points, exactly GPyTorch's ``ExactMarginalLogLikelihood``. With FedAvg
            weights ``n_k / N`` every client adds the prior, so the fixed point is the MAP of
            ``p(y | θ) p(θ)^(N / M)``: the prior counts N / M times. ``w = 1 / N`` (N the
            federation's total training points, ``prior_weight=1 / federation.total_points``)
            makes ``Σ_k (n_k / N) [ℓ_k / n_k + w log p(θ)] = (Σ_k ℓ_k + log p(θ)) / N``, the
            global MAP objective on pooled data, per point.
    """

    def __init__(
        self,
        kernel: gpytorch.kernels.Kernel | str | None = None,
        mean: gpytorch.means.Mean | str | None = None,
        likelihood: gpytorch.likelihoods.GaussianLikelihood | None = None,
        *,
        ard: bool = defaults.ARD,
        input_dim: int | None = None,
        initial_values: Mapping[str, float | torch.Tensor] | None = None,
        fixed: Iterable[str] = (),
        dtype: torch.dtype = torch.float64,
        prior_weight: float | None = None,
    ) -> None:
        kernel = defaults.KERNEL if kernel is None else kernel
        mean = defaults.MEAN if mean is None else mean
        _check_module("kernel", kernel, gpytorch.kernels.Kernel, "gpytorch.kernels.MaternKernel(nu=2.5)")
        _check_module("mean", mean, gpytorch.means.Mean, "gpytorch.means.ZeroMean()")
        if not isinstance(ard, bool):
            raise InputTypeError(f"ard must be True or False, got {ard!r}")
        if input_dim is not None and (
            isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1
        ):
            raise InputError(
                f"input_dim must be a positive number of input features (or None), got {input_dim!r}"
            )
        given = likelihood
        likelihood = gpytorch.likelihoods.GaussianLikelihood() if likelihood is None else likelihood
        self._check_likelihood(likelihood)
        if dtype not in (torch.float32, torch.float64):
            raise InputError(f"dtype must be torch.float64 or torch.float32, got {dtype}")
        if prior_weight is not None and not prior_weight >= 0:
            raise InputError(f"prior_weight must be >= 0 (or None for GPyTorch's 1 / M), got {prior_weight}")
        self.dtype, self.prior_weight = dtype, prior_weight
        # Modules given by name whose shape depends on the inputs' width are built again for the
        # data's width by for_inputs (fit); until then at width 1 (input_dim None).
        self._recipe = None
        if needs_width(kernel, mean, ard):
            self._recipe = dict(kernel=kernel, mean=mean, likelihood=copy.deepcopy(given), ard=ard,
                                initial_values=dict(initial_values or {}), fixed=tuple(fixed), dtype=dtype,
                                prior_weight=prior_weight)  # fmt: skip
        self.input_dim = input_dim if self._recipe is not None else None
        width = input_dim or 1
        kernel, mean = make_kernel(kernel, width, ard), make_mean(mean, width)
        self._template = self._make_template(
            copy.deepcopy(mean), copy.deepcopy(kernel), copy.deepcopy(likelihood)
        ).to(dtype)
        fixed = set(fixed)
        params = []
        for raw_name, param, constraint in self._template.named_parameters_and_constraints():
            if self._is_personal(raw_name):
                continue
            name = _state_name(raw_name, constraint is not None)
            aliases = {name, raw_name, _state_name(raw_name, True)}
            trainable = param.requires_grad and not (aliases & fixed)
            fixed -= aliases
            params.append(ParamInfo(name, raw_name, param.shape, constraint, trainable))
        if fixed:
            known = ", ".join(p.name for p in params)
            raise InputError(f"fixed names {sorted(fixed)} are not hyper-parameters; known: {known}")
        self.params: tuple[ParamInfo, ...] = tuple(params)
        self._by_name = {p.name: p for p in params}
        # Every parameter answers to its GPyTorch raw name and to its constrained (property) name:
        # ``mean_module.constant`` as well as the state name ``mean_module.raw_constant``.
        self._aliases = {}
        for p in params:
            self._aliases[p.raw_name] = p
            self._aliases[_state_name(p.raw_name, True)] = p
        if initial_values:
            values = self._module_names(initial_values)  # unknown names are refused here
            try:
                self._template.initialize(**values)
            except (RuntimeError, ValueError):
                if not self.sizes_later:
                    raise
                # a value of the data's width (one lengthscale per feature): set when sized
        for p in self._template.parameters():
            p.requires_grad_(True)

    @property
    def sizes_later(self) -> bool:
        """Whether modules given by name wait for the data's width (:meth:`for_inputs`)."""
        return self._recipe is not None and self.input_dim is None

    def for_inputs(self, d: int) -> GPSpec:
        """This spec for data of ``d`` input features: modules given by name (``GPSpec()``'s
        default kernel, one lengthscale per feature) built at width ``d``, with the same likelihood,
        initial values, fixed names, dtype and prior weight. A spec of modules (or already built for
        a width) is returned as it is: where its width differs from the data's, the engines' check
        (:meth:`check_input_dim`) says which module to change."""
        if not self.sizes_later:
            return self
        recipe = dict(self._recipe)
        likelihood = recipe.pop("likelihood")
        return GPSpec(
            recipe.pop("kernel"), recipe.pop("mean"), copy.deepcopy(likelihood), input_dim=d, **recipe
        )

    def for_data(self, clients) -> GPSpec:
        """:meth:`for_inputs` at the width of the first of ``clients`` (as it is without clients)."""
        clients = list(clients)
        return self.for_inputs(clients[0].n_features) if clients else self

    # -- what a subclass changes ---------------------------------------------------------------
    def _check_likelihood(self, likelihood: gpytorch.likelihoods.Likelihood) -> None:
        """Refuse a likelihood this kind of model cannot use (an exact GP: Gaussian ones only)."""
        if not isinstance(likelihood, gpytorch.likelihoods._GaussianLikelihoodBase):
            raise InputTypeError(
                "fedgp needs a Gaussian likelihood for exact marginal likelihoods, "
                f"got {type(likelihood).__name__}; any GPyTorch likelihood works with "
                "fedgp.VariationalGPSpec"
            )

    def _make_template(self, mean, kernel, likelihood) -> gpytorch.Module:
        """The GPyTorch model every client's model copies."""
        return ExactGPModel(mean, kernel, likelihood)

    def _is_personal(self, raw_name: str) -> bool:
        """Whether a model parameter is the client's own, never in a state (none in an exact GP)."""
        return False

    def mean_inputs(self, X: torch.Tensor) -> torch.Tensor:
        """The columns of rows ``X`` that the mean module reads (all of them here; a multi-output spec
        keeps the output column from a mean of the features). Code that evaluates the mean outside
        the model (the clustered strategies' closed forms) reads them through this."""
        return X

    @property
    def variational(self) -> bool:
        """Whether clients fit a variational distribution of their own (:class:`VariationalGPSpec`)."""
        return False

    @property
    def server_averaged(self) -> frozenset[str]:
        """Raw parameters a server optimiser (FedAdam, ...) does not step on: the server takes the
        clients' plain average of these (none in an exact GP; the inducing locations of a
        :class:`VariationalGPSpec`)."""
        return frozenset()

    @property
    def keeps_client_memory(self) -> bool:
        """Whether each owner keeps a part of its own model between rounds, never sent (an
        :class:`~fedgp.models.own_features.OwnFeaturesSpec`'s own kernels; none here)."""
        return False

    @property
    def conjugate(self) -> bool:
        """Whether the likelihood is Gaussian: the predictive of y is Gaussian and targets may be
        standardised (always, for an exact GP; a :class:`VariationalGPSpec` may take any likelihood)."""
        return isinstance(self.likelihood, gpytorch.likelihoods._GaussianLikelihoodBase)

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The test metrics each client reports (``result.evaluate()``'s columns)."""
        return ("rmse", "nll", "coverage95")

    # -- introspection --------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Every hyper-parameter's dotted name, in the spec's order (fixed ones included)."""
        return tuple(p.name for p in self.params)

    @property
    def trainable_names(self) -> tuple[str, ...]:
        """The names of the hyper-parameters that training changes (not ``fixed``)."""
        return tuple(p.name for p in self.params if p.trainable)

    @property
    def event_shapes(self) -> dict[str, torch.Size]:
        """Each hyper-parameter's own shape (without batch dimensions)."""
        return {p.name: p.shape for p in self.params}

    def param(self, name: str) -> ParamInfo:
        """The :class:`ParamInfo` of a hyper-parameter, by its constrained or raw name; an unknown name
        is a ``KeyError`` listing the known ones."""
        try:
            return self._by_name[name] if name in self._by_name else self._aliases[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown hyper-parameter {name!r}; known: {', '.join(self.names)}"
            ) from None

    @property
    def kernel(self) -> gpytorch.kernels.Kernel:
        """The spec's GPyTorch kernel module (the template every client's model copies)."""
        return self._template.covar_module

    @property
    def mean(self) -> gpytorch.means.Mean:
        """The spec's GPyTorch mean module."""
        return self._template.mean_module

    @property
    def likelihood(self) -> gpytorch.likelihoods.GaussianLikelihood:
        """The spec's GPyTorch likelihood."""
        return self._template.likelihood

    def _module_names(self, values: Mapping[str, float | torch.Tensor]) -> dict:
        out = {}
        for name, value in values.items():
            info = self.param(name)
            # GPyTorch's ``initialize`` reads a raw name as a raw value and a property name as a
            # constrained one; an unconstrained parameter exists only under its raw name.
            key = info.raw_name if name == info.raw_name or info.constraint is None else info.name
            out[key] = torch.as_tensor(value, dtype=self.dtype)
        return out

    @property
    def fixed_noise(self) -> bool:
        """Whether the likelihood takes known per-point noise (``FixedNoiseGaussianLikelihood``)."""
        return isinstance(self.likelihood, gpytorch.likelihoods.FixedNoiseGaussianLikelihood)

    def client_noise(self, client) -> torch.Tensor | None:
        """A client's known per-point noise variances (``ClientData.noise``: they stay with its data,
        never in the state) when the likelihood takes them, else ``None``."""
        if not self.fixed_noise:
            return None
        if client.noise is None:
            raise InputError(
                f"client {client.id!r}: the spec's FixedNoiseGaussianLikelihood needs each client's "
                "per-point noise variances; give them as ClientData(..., noise=...)"
            )
        return client.noise.to(self.dtype)

    def check_input_dim(self, d: int, client: object = None) -> None:
        """Raise a ``ValueError`` naming the module when the spec cannot take ``d`` input features
        (an ``ard_num_dims``, ``active_dims`` or ``LinearMean`` width that differs), instead of
        GPyTorch's size error deep inside a kernel."""
        whose = f"client {client!r} has" if client is not None else "the data have"

        def walk(module: torch.nn.Module, path: str, width: int) -> None:
            active = getattr(module, "active_dims", None)
            if isinstance(module, gpytorch.kernels.Kernel) and active is not None:
                if int(active.max()) >= d:
                    raise InputError(
                        f"{path} ({type(module).__name__}) has active_dims={active.tolist()} but {whose} "
                        f"{d} input features; use active_dims below {d}"
                    )
                width = len(active)
            ard = getattr(module, "ard_num_dims", None)
            if isinstance(module, gpytorch.kernels.Kernel) and ard is not None and ard != width:
                raise InputError(
                    f"{path} ({type(module).__name__}) has ard_num_dims={ard} but {whose} {width} input "
                    f"features{' in its active_dims' if active is not None else ''}; "
                    f"build it with ard_num_dims={width}"
                )
            for name, child in module.named_children():
                walk(child, f"{path}.{name}", width)

        walk(self.kernel, "covar_module", d)
        for name, module in self.mean.named_modules():
            weights = module.weights if isinstance(module, gpytorch.means.LinearMean) else None
            if weights is not None and weights.shape[-2] != d:
                path = "mean_module" + (f".{name}" if name else "")
                raise InputError(
                    f"{path} ({type(module).__name__}) takes {weights.shape[-2]} input features but "
                    f"{whose} {d}; build it with input_size={d}"
                )

    # -- models and states --------------------------------------------------------------------
    def build(self) -> ExactGPModel:
        """A fresh GPyTorch model (a deep copy of the template)."""
        return copy.deepcopy(self._template)

    def initial_state(self) -> HyperState:
        """The modules' current values (GPyTorch defaults unless ``initial_values`` were given)."""
        return self.read(self._template)

    def state(self, values: Mapping[str, float | torch.Tensor]) -> HyperState:
        """A full state from the initial one with some values replaced, e.g. the true θ*."""
        base = dict(self.initial_state())
        for name, value in values.items():
            info = self.param(name)
            if name == info.raw_name and info.constraint is not None:
                raise InputError(f"state values are constrained: give {info.name!r}, not the raw {name!r}")
            value = torch.as_tensor(value, dtype=self.dtype)
            try:
                base[info.name] = value.expand(info.shape).clone()
            except RuntimeError:
                if not self.sizes_later:
                    raise
                raise InputError(
                    f"{info.name}: a value of shape {tuple(value.shape)} for a spec not yet built for the "
                    f"data's width (its named kernel is sized by fit, one lengthscale per feature): use "
                    "spec.for_inputs(d).state(...)"
                ) from None
        return HyperState(base, self.event_shapes)

    def read(self, model: ExactGPModel) -> HyperState:
        """The constrained values held by a model built from this spec."""
        with torch.no_grad():
            values = {p.name: p.transform(model.get_parameter(p.raw_name)).clone() for p in self.params}
        return HyperState(values, self.event_shapes)

    def to_raw(self, state: HyperState) -> HyperState:
        """Constrained -> raw (GPyTorch's unconstrained parametrisation), same names."""
        return HyperState(
            {p.name: p.inverse_transform(state[p.name]) for p in self.params}, self.event_shapes
        )

    def from_raw(self, raw: HyperState) -> HyperState:
        """Constrained values from raw ones: each parameter through its constraint's transform."""
        return HyperState({p.name: p.transform(raw[p.name]) for p in self.params}, self.event_shapes)

    def load_raw(self, model: ExactGPModel, raw: Mapping[str, torch.Tensor]) -> None:
        """Write raw values into a model's parameters in place (no autograd history)."""
        with torch.no_grad():
            for p in self.params:
                if p.name in raw:
                    model.get_parameter(p.raw_name).copy_(raw[p.name])

    def load(self, model: ExactGPModel, state: Mapping[str, torch.Tensor]) -> None:
        """Set ``model``'s parameters to ``state`` (constrained values, a :class:`HyperState` or a
        plain mapping of the same names). Each value goes through its constraint's inverse straight
        into the model: no raw state is built on the way (every local step and predict loads one)."""
        with torch.no_grad():
            for p in self.params:
                model.get_parameter(p.raw_name).copy_(p.inverse_transform(state[p.name]))

    def __repr__(self) -> str:
        fixed = [p.name for p in self.params if not p.trainable]
        width = ", sized to the data by fit" if self.sizes_later else ""
        return (
            f"GPSpec(mean={type(self.mean).__name__}, kernel={self.kernel.__class__.__name__}{width}, "
            f"params={list(self.names)}" + (f", fixed={fixed})" if fixed else ")")
        )
