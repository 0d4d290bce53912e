"""Owners with features of their own: a shared kernel on the core, a personal kernel on the rest.

The owners of a federation share a core of named input columns and may record more of their own
(:class:`fedgp.data.owners.OwnerData`). :class:`OwnFeaturesSpec` names the core. The model of an
owner with own columns ``z`` beside the core ``x`` is *additive*::

    f(x, z) = f_core(x) + f_own(z),    f_core ~ GP(m(x), k_core),   f_own ~ GP(0, k_own)

``m``, ``k_core`` and the likelihood are the federation's (averaged as every spec's are); ``k_own``
(a ``ScaleKernel`` of the named ``own_kernel``, one lengthscale per own column) is the owner's: its
hyper-parameters are trained by that owner on its own likelihood and kept by it
(:mod:`fedgp.strategies.memory`), never sent. Additive rather than a product, so that an owner
without own columns has exactly the model a plain :class:`~fedgp.models.spec.GPSpec` gives it, and an
owner whose own columns carry nothing can switch its own part off (outputscale towards 0) instead
of letting it modulate the core's covariance. The own columns are put on the unit cube by the owner's
own training min and max (the federation normalises the core: the own columns are never summarised).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

import gpytorch
import torch

from fedgp import defaults
from fedgp.data.client import ClientData, Federation
from fedgp.data.names import check_names
from fedgp.data.owners import OwnerData, split_core
from fedgp.errors import InputError
from fedgp.models.named import KERNELS, make_kernel, pick
from fedgp.models.spec import ExactGPModel, GPSpec

__all__ = ["OwnFeaturesSpec", "OwnerSpec", "OwnFeaturesModel", "OWN", "refuse_own_part"]

#: The prefix of an owner's own hyper-parameters' names (``own_module.outputscale``, ...).
OWN = "own_module."


class OwnFeaturesModel(ExactGPModel):
    """``MultivariateNormal(m(x), k_core(x) + k_own(z))`` on rows ``[x, z]``: the first
    ``core_width`` columns are the core, the rest the owner's own."""

    def __init__(self, mean_module, covar_module, likelihood, own_module, core_width: int):
        super().__init__(mean_module, covar_module, likelihood)
        self.own_module, self.core_width = own_module, core_width

    def forward(self, x) -> gpytorch.distributions.MultivariateNormal:
        """The prior at rows ``[x, z]``: the shared mean and kernel of ``x`` plus the own kernel of ``z``."""
        core, own = x[..., : self.core_width], x[..., self.core_width :]
        covariance = self.covar_module(core) + self.own_module(own)
        return gpytorch.distributions.MultivariateNormal(self.mean_module(core), covariance)


class OwnFeaturesSpec(GPSpec):
    """A :class:`~fedgp.models.spec.GPSpec` whose kernel and mean act on the named ``core``
    columns, and whose owners may hold own columns that enter a personal additive kernel.

    Args:
        core: the core features' names, in the order the shared kernel reads them.
        own_kernel: the own part's kernel by name (``"rbf"``, ``"matern52"``, ...), inside a
            ``ScaleKernel`` with one lengthscale per own column (GPyTorch's initial lengthscale).
        own_outputscale: the own part's starting outputscale, small (0.05 of the standardised
            outputs' unit variance by default) so that an own part grows only where its owner's
            likelihood asks for it: from GPyTorch's 0.69 an own column of pure noise was still
            fitting noise after the rounds a driving one needed (``benchmarks/own_features.py``).
        kernel, mean, likelihood, ard, initial_values, fixed, dtype, prior_weight: as
            :class:`~fedgp.models.spec.GPSpec`'s, for the shared part (named modules are built for
            the core's width).

    Build the federation with :meth:`federation` (each owner's named columns split into core and
    own). The owners' own parts are trained under :class:`~fedgp.strategies.FGPR` on the sequential
    engine; other strategies and engines are refused at ``fit``, saying why.
    """

    def __init__(
        self,
        core: Sequence[str],
        kernel: gpytorch.kernels.Kernel | str | None = None,
        mean: gpytorch.means.Mean | str | None = None,
        likelihood: gpytorch.likelihoods.GaussianLikelihood | None = None,
        *,
        own_kernel: str = "rbf",
        own_outputscale: float = 0.05,
        ard: bool = defaults.ARD,
        initial_values: Mapping[str, float | torch.Tensor] | None = None,
        fixed: Iterable[str] = (),
        dtype: torch.dtype = torch.float64,
        prior_weight: float | None = None,
    ) -> None:
        core = check_names(core, None, "OwnFeaturesSpec(core=...)")
        if not core:
            raise InputError("OwnFeaturesSpec(core=...): name at least one core feature")
        pick("own_kernel", own_kernel, KERNELS, "a kernel name")
        if (
            isinstance(own_outputscale, bool)
            or not isinstance(own_outputscale, (int, float))
            or not own_outputscale > 0
        ):
            raise InputError(
                f"OwnFeaturesSpec(own_outputscale=...) must be a number > 0, got {own_outputscale!r}"
            )
        self.core, self.own_kernel, self.own_outputscale = core, own_kernel, float(own_outputscale)
        self._owners: dict[int, OwnerSpec] = {}
        super().__init__(
            kernel,
            mean,
            likelihood,
            ard=ard,
            input_dim=len(core),
            initial_values=initial_values,
            fixed=fixed,
            dtype=dtype,
            prior_weight=prior_weight,
        )

    @property
    def keeps_client_memory(self) -> bool:
        """Owners keep their own part's hyper-parameters between rounds."""
        return True

    def for_owner(self, width: int) -> OwnerSpec:
        """The model of an owner with ``width`` own columns: this spec's shared part plus its own."""
        if width not in self._owners:
            self._owners[width] = OwnerSpec(self, width)
        return self._owners[width]

    def federation(self, clients: Iterable[ClientData]) -> Federation:
        """The federation of ``clients`` whose columns are named: each client's core columns (in
        :attr:`core`'s order) in ``X``, the rest its own (:func:`fedgp.data.owners.split_core`). A
        client without a core column is refused, naming it and the column."""
        return Federation([split_core(client, self.core) for client in clients])

    def check_federation(self, federation: Federation) -> None:
        """Refuse a federation whose columns are not this spec's core, naming the missing and the
        extra ones, and an owner whose own column is named like a core one."""
        names = federation.feature_names
        if names is None or tuple(names) != self.core:
            given = [] if names is None else list(names)
            missing = [n for n in self.core if n not in given]
            extra = [n for n in given if n not in self.core]
            raise InputError(
                f"the federation's columns {given} are not the spec's core {list(self.core)}"
                + (f": missing core feature(s) {missing}" if missing else "")
                + (
                    f"; not in the core {extra}: an owner's own features go in its own columns"
                    if extra
                    else ""
                )
                + "; build it with spec.federation(clients) from each owner's named columns"
            )
        for client in federation:
            twice = [n for n in (getattr(client, "own_names", None) or ()) if n in self.core]
            if twice:
                raise InputError(
                    f"client {client.id!r}, own: {twice} also name core feature(s); a column is either "
                    "the core (X) or the owner's own (own), not both"
                )

    def __repr__(self) -> str:
        own = f"core={list(self.core)}, own_kernel={self.own_kernel!r}"
        return f"OwnFeaturesSpec({own}, shared={super().__repr__()})"


class OwnerSpec(GPSpec):
    """The model of one owner with own columns: the shared spec's modules (the same state names) and
    an own kernel of ``width`` columns, whose hyper-parameters (:attr:`own_names`) are the owner's."""

    def __init__(self, shared: OwnFeaturesSpec, width: int):
        self._own = make_kernel(shared.own_kernel, width, ard=True)
        self._own.outputscale = shared.own_outputscale
        self._core_width = len(shared.core)
        fixed = [p.name for p in shared.params if not p.trainable]
        super().__init__(
            copy.deepcopy(shared.kernel),
            copy.deepcopy(shared.mean),
            copy.deepcopy(shared.likelihood),
            fixed=fixed,
            dtype=shared.dtype,
            prior_weight=shared.prior_weight,
        )
        self.own_names = frozenset(p.name for p in self.params if p.name.startswith(OWN))

    def _make_template(self, mean, kernel, likelihood) -> OwnFeaturesModel:
        return OwnFeaturesModel(mean, kernel, likelihood, copy.deepcopy(self._own), self._core_width)


def refuse_own_part(spec: GPSpec, client: ClientData, what: str) -> None:
    """Refuse ``what`` for an owner whose model has an own part: what it needs (the own part's
    hyper-parameters) stays with the owner. An owner without own columns has today's model and passes."""
    if isinstance(spec, OwnFeaturesSpec) and isinstance(client, OwnerData):
        raise InputError(
            f"{what} (client {client.id!r}): this owner's model has an own part on its columns "
            f"{list(client.own_names or ())}, whose hyper-parameters it keeps to itself; {what} reads the "
            "shared model alone, so it is not supported for such an owner: predict with "
            "result.predict(X, client=...)"
        )
