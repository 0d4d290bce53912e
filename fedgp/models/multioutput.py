"""Multi-output GPs in the Hadamard (long) form: one row per observed output, its index in X's last column.

T outputs of the same inputs share one input kernel and a task covariance (the intrinsic
coregionalisation model, ICM; Bonilla, Chai & Williams 2007):
``cov(f_t(x), f_t'(x')) = k(x, x') · B[t, t']`` with ``B = W Wᵀ + diag(v)``, W of shape (T, rank):
GPyTorch's ``IndexKernel`` (``covar_factor`` = W, ``var`` = v); or a sum of Q such terms, each
with its own input kernel (the linear model of coregionalisation, LMC). A row is ``(x, t, y)``: the data
are GPyTorch's "Hadamard multitask" form, so an owner may hold any subset of the outputs at each
input (:func:`fedgp.data.outputs.long_form` turns an (n, T) table with NaN for the missing outputs
into such rows).

Why the task index is a column of X and not a field of its own: every layer of fedgp moves rows of
X and y together (minibatches, splits, partitions, engines, the records of a Flower message), so a
task column rides along everywhere unchanged, as BoTorch's ``MultiTaskGP`` keeps it
(``task_feature``). Only the model reads it; the input transform leaves it alone, and the outcome
transform standardises each output by its own federated mean and sd (:mod:`fedgp.transforms`).

Under FGPR, W and v are hyper-parameters like any other: averaged by the server, trained by each
owner on its own rows; each owner's posterior is exact on its own rows.
"""

from __future__ import annotations

import copy
from typing import Any

import gpytorch
import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.models.spec import GPSpec

__all__ = [
    "MultiOutputSpec",
    "HadamardGPModel",
    "TaskMean",
    "OutputNoise",
    "output_rows",
    "check_task_column",
]


def check_task_column(X: torch.Tensor, outputs: int, where: str) -> torch.Tensor:
    """The task indices in ``X``'s last column, as longs; a value that is not an integer in
    ``[0, outputs)`` is refused, naming ``where`` and the row (a negative index would otherwise wrap
    around silently in GPyTorch's ``IndexKernel``)."""
    if X.dim() < 2 or X.shape[-1] < 2:
        raise InputError(
            f"{where}: a multi-output spec reads the output index from X's last column, after at least "
            f"one input feature; got X of shape {tuple(X.shape)}"
        )
    task = X[..., -1]
    index = task.round()
    bad = (index != task) | (index < 0) | (index > outputs - 1) | ~torch.isfinite(task)
    if bool(bad.any()):
        row = int(torch.nonzero(bad.reshape(-1))[0])
        value = float(task.reshape(-1)[row])
        raise InputError(
            f"{where}: output index {value:g} in row {row} (X's last column) is out of range: this spec "
            f"has {outputs} outputs, indexed 0 to {outputs - 1}"
        )
    return index.long()


def output_rows(X: torch.Tensor, outputs: int) -> torch.Tensor:
    """The rows asking for every output at each of the inputs ``X`` (m, d): ``(m·T, d + 1)``, input by
    input, so a prediction at them reshapes to ``(m, T)``: ``result.predict(rows, k)[0].reshape(m, T)``."""
    X = torch.as_tensor(X, dtype=torch.float64)
    if X.dim() != 2:
        raise InputError(
            f"output_rows: X must be (m, d) inputs without the output column, got {tuple(X.shape)}"
        )
    m = X.shape[0]
    tasks = torch.arange(outputs, dtype=X.dtype).repeat(m)
    return torch.cat([X.repeat_interleave(outputs, 0), tasks[:, None]], 1)


class TaskMean(gpytorch.means.Mean):
    """One constant per output, ``m(x, t) = c_t`` (the default mean of :class:`MultiOutputSpec`): each
    output keeps its own level. Starts at zero; ``constant`` has no constraint."""

    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.register_parameter("constant", torch.nn.Parameter(torch.zeros(outputs)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``c_t`` for rows ``x`` whose last column is the output index t."""
        return self.constant[x[..., -1].long()]


class OutputNoise(gpytorch.likelihoods.HadamardGaussianLikelihood):
    """One noise variance per output: GPyTorch's ``HadamardGaussianLikelihood`` reading the output index
    from the rows' last column (state name ``likelihood.noise_covar.noise``, shape (T,)). fedgp's
    marginal likelihood calls it without the rows, as for any Gaussian likelihood; it then reads those
    of the model's last prior, which :class:`HadamardGPModel` records (the rows the call is about)."""

    def __init__(self, outputs: int, **kwargs: Any) -> None:
        super().__init__(num_tasks=outputs, task_feature_index=-1, **kwargs)
        self.rows: torch.Tensor | None = None

    def _shaped_noise_covar(self, base_shape: torch.Size, *params: Any, **kwargs: Any):
        if not params:
            params = (self.rows,)
        return super()._shaped_noise_covar(base_shape, *params, **kwargs)


class HadamardGPModel(gpytorch.models.ExactGP):
    """GPyTorch's Hadamard multitask exact GP: ``k((x, t), (x', t')) = k_x(x, x') · B[t, t']`` (ICM), or
    ``Σ_q k_q(x, x') · B_q[t, t']`` (LMC), the task index in the inputs' last column. The mean module
    sees the input features (a :class:`TaskMean` the whole row, to read the output index)."""

    def __init__(self, mean_module, covar_module, task_covar_module, likelihood, outputs: int):
        super().__init__(None, None, likelihood)
        self.mean_module = mean_module
        self.covar_module = covar_module
        self.task_covar_module = task_covar_module
        self.outputs = outputs
        # LMC: covar_module holds the Q input kernels (an AdditiveKernel, as a container) and
        # task_covar_module the Q task covariances (a ModuleList); their products are summed.
        self.lmc = isinstance(task_covar_module, torch.nn.ModuleList)

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        """The prior at rows ``x``: features, then the output index (checked: out of range is an error)."""
        task = check_task_column(x, self.outputs, "MultiOutputSpec")
        if isinstance(self.likelihood, OutputNoise):
            self.likelihood.rows = x
        inputs = x[..., :-1]
        mean = self.mean_module(mean_inputs(self.mean_module, x))
        i = task.unsqueeze(-1)
        if self.lmc:
            terms = zip(self.covar_module.kernels, self.task_covar_module)
            covar = sum(k(inputs).mul(b(i)) for k, b in terms)
        else:
            covar = self.covar_module(inputs).mul(self.task_covar_module(i))
        return gpytorch.distributions.MultivariateNormal(mean, covar)


def mean_inputs(mean: gpytorch.means.Mean, x: torch.Tensor) -> torch.Tensor:
    """What ``mean`` reads of rows ``x``: the whole row for a :class:`TaskMean` (it reads the output
    index), the input features (without the output column) for any other mean."""
    return x if isinstance(mean, TaskMean) else x[..., :-1]


def _task_kernel(outputs: int, rank: int, term: int = 0) -> gpytorch.kernels.IndexKernel:
    """``IndexKernel(outputs, rank)`` starting from a W drawn by a generator of its own (GPyTorch draws
    it from torch's global one: the same fit would start elsewhere in every process; seed ``term``, so
    an LMC's terms start apart) at N(0, 1/rank), so that W Wᵀ starts near the identity's scale; v
    starts at softplus(0)."""
    kernel = gpytorch.kernels.IndexKernel(num_tasks=outputs, rank=rank)
    with torch.no_grad():
        g = torch.Generator().manual_seed(term)
        kernel.covar_factor.copy_(
            torch.randn(outputs, rank, generator=g, dtype=torch.float64) / max(rank, 1) ** 0.5
        )
        kernel.raw_var.zero_()
    return kernel


def _input_kernels(kernel: Any) -> tuple[Any, int]:
    """``(kernel, Q)``: one kernel (or name) for an ICM; a list of Q GPyTorch kernels for an LMC, held in
    an ``AdditiveKernel`` as their container (the model multiplies each by its own task covariance)."""
    if isinstance(kernel, gpytorch.kernels.IndexKernel):
        raise InputTypeError(
            "MultiOutputSpec: kernel is the input kernel k_x; the task covariance is built from "
            "outputs= and rank="
        )
    if not isinstance(kernel, (list, tuple)):
        return kernel, 1
    if not kernel or not all(isinstance(k, gpytorch.kernels.Kernel) for k in kernel):
        raise InputTypeError(
            "MultiOutputSpec: an LMC takes a non-empty list of GPyTorch kernels, one per term, got "
            f"{[type(k).__name__ for k in kernel]}"
        )
    if len(kernel) == 1:
        return kernel[0], 1
    return gpytorch.kernels.AdditiveKernel(*kernel), len(kernel)


class MultiOutputSpec(GPSpec):
    """A GP of ``outputs`` outputs with an ICM task covariance, specified with GPyTorch modules.

    The data are rows ``(x, t, y)`` with the output index t in X's last column (build them with
    :func:`fedgp.data.outputs.long_form`); a client may hold any outputs at any of its inputs.

    Args:
        kernel: the input kernel k_x, any GPyTorch kernel or a name (``"rbf"`` ...; built *without* a
            ``ScaleKernel``: B's diagonal is each output's scale, and an outputscale on top could not
            be told apart from it). It acts on the input features (X without its last column). A list
            of Q GPyTorch kernels makes an LMC, ``Σ_q k_q(x, x') B_q[t, t']`` with a B_q of rank
            ``rank`` each (state names ``covar_module.kernels.<q>.…``, ``task_covar_module.<q>.…``).
        mean: a GPyTorch mean of the input features shared by every output, a name, or ``None``
            (default): :class:`TaskMean`, one constant per output.
        likelihood: default ``GaussianLikelihood()``: one noise variance for every output (as in
            GPyTorch's Hadamard example), in each output's standardised units.
        output_noise: one noise variance per output instead (:class:`OutputNoise`).
        outputs: T, the number of outputs (>= 1).
        rank: the rank of W (0 to T; default 1). ``rank=0`` makes B diagonal: independent outputs
            sharing the input kernel.
        options: ``ard``, ``input_dim``, ``initial_values``, ``fixed``, ``dtype``, ``prior_weight``, as
            :class:`~fedgp.GPSpec`; ``input_dim`` counts the input features, without the output column.
            The task covariance's state names are ``task_covar_module.covar_factor`` (W) and
            ``task_covar_module.var`` (v).

    ``result.predict(rows, client=k)`` predicts at rows in the same form: one value per row, for the
    output its last column names (:func:`output_rows` asks for all T at each input; reshape to (m, T)).
    ``fit``'s default transforms scale the input features to the unit cube, leave the output column as
    it is, and standardise each output by its own federated mean and sd (:mod:`fedgp.transforms`).
    """

    def __init__(
        self,
        kernel: gpytorch.kernels.Kernel | str | None = None,
        mean: gpytorch.means.Mean | str | None = None,
        likelihood: gpytorch.likelihoods.GaussianLikelihood | None = None,
        *,
        outputs: int,
        rank: int = 1,
        output_noise: bool = False,
        **options: Any,
    ) -> None:
        if isinstance(outputs, bool) or not isinstance(outputs, int) or outputs < 1:
            raise InputError(
                f"MultiOutputSpec: outputs must be a positive int (the number T), got {outputs!r}"
            )
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= outputs:
            raise InputError(
                f"MultiOutputSpec: rank must be an int from 0 to outputs={outputs}, got {rank!r}"
            )
        kernel, self.terms = _input_kernels(kernel)
        self.outputs, self.rank = outputs, rank
        if output_noise:
            if likelihood is not None:
                raise InputError("MultiOutputSpec: give output_noise=True or a likelihood, not both")
            likelihood = OutputNoise(outputs)
        self._named_kernel = kernel is None or isinstance(kernel, str)
        mean = TaskMean(outputs) if mean is None else mean
        options["fixed"] = tuple(options.get("fixed", ()))  # an iterator would be spent by the first use
        self._arguments = dict(kernel=kernel, mean=copy.deepcopy(mean), likelihood=copy.deepcopy(likelihood))
        self._options = copy.deepcopy(options)
        super().__init__(kernel, mean, likelihood, **options)

    # -- GPSpec's hooks ---------------------------------------------------------------------------
    def _make_template(self, mean, kernel, likelihood) -> HadamardGPModel:
        if self._named_kernel and isinstance(kernel, gpytorch.kernels.ScaleKernel):
            kernel = kernel.base_kernel  # B's diagonal is the scale
        if self.terms > 1:
            tasks = [_task_kernel(self.outputs, self.rank, q) for q in range(self.terms)]
            return HadamardGPModel(mean, kernel, torch.nn.ModuleList(tasks), likelihood, self.outputs)
        return HadamardGPModel(mean, kernel, _task_kernel(self.outputs, self.rank), likelihood, self.outputs)

    def _is_personal(self, raw_name: str) -> bool:
        """Rank 0: W has no entries, so it is in no state (the model keeps its empty (T, 0) matrix)."""
        return (
            self.rank == 0 and raw_name.endswith("covar_factor") and raw_name.startswith("task_covar_module.")
        )

    def mean_inputs(self, X: torch.Tensor) -> torch.Tensor:
        """The columns the mean reads (:func:`mean_inputs`): a mean of the features never sees the
        output index, in the model or in the clustered strategies' closed forms."""
        return mean_inputs(self.mean, X)

    def for_inputs(self, d: int) -> MultiOutputSpec:
        """This spec for data of ``d`` columns: ``d - 1`` input features and the output column."""
        if not self.sizes_later:
            return self
        options = {**copy.deepcopy(self._options), "input_dim": max(d - 1, 1)}
        return MultiOutputSpec(
            **copy.deepcopy(self._arguments), outputs=self.outputs, rank=self.rank, **options
        )

    def for_data(self, clients) -> MultiOutputSpec:
        """:meth:`for_inputs` for ``clients``, after checking every client's output column (training and
        test rows): each an integer from 0 to T − 1, or an error naming the client and the row."""
        clients = list(clients)
        for client in clients:
            check_task_column(client.X, self.outputs, f"client {client.id!r}, X")
            if client.X_test is not None:
                check_task_column(client.X_test, self.outputs, f"client {client.id!r}, X_test")
        return self.for_inputs(clients[0].n_features) if clients else self

    def check_input_dim(self, d: int, client: object = None) -> None:
        """As :meth:`GPSpec.check_input_dim` for the ``d - 1`` input features (the last column is the
        output index)."""
        if d < 2:
            whose = f"client {client!r}" if client is not None else "the data"
            raise InputError(
                f"{whose}: a MultiOutputSpec needs X with the input features and then the output index "
                f"as its last column; got {d} column(s)"
            )
        super().check_input_dim(d - 1, client)

    @property
    def task_kernel(self) -> gpytorch.kernels.IndexKernel:
        """The spec's task covariance module (GPyTorch's ``IndexKernel``)."""
        return self._template.task_covar_module

    def task_covariances(self, state) -> torch.Tensor:
        """Each term's B_q = W_q W_qᵀ + diag(v_q) under a state, (Q, T, T) (Q = 1 for an ICM)."""
        out = []
        for q in range(self.terms):
            prefix = f"task_covar_module.{q}." if self.terms > 1 else "task_covar_module."
            B = torch.diag_embed(state[prefix + "var"])
            if self.rank:
                W = state[prefix + "covar_factor"]
                B = B + W @ W.transpose(-1, -2)
            out.append(B)
        return torch.stack(out)

    def task_covariance(self, state) -> torch.Tensor:
        """Σ_q B_q under a state, (T, T): B for an ICM; for an LMC the outputs' covariance at one input
        where every k_q(x, x) = 1 (RBF, Matérn without a ScaleKernel)."""
        return self.task_covariances(state).sum(0)

    def task_correlation(self, state) -> torch.Tensor:
        """B scaled to unit diagonal: the outputs' correlation under a state, (T, T)."""
        B = self.task_covariance(state)
        sd = B.diagonal(dim1=-2, dim2=-1).sqrt()
        return B / (sd[..., :, None] * sd[..., None, :])

    def __repr__(self) -> str:
        return (
            f"MultiOutputSpec(outputs={self.outputs}, rank={self.rank}, terms={self.terms}, "
            f"mean={type(self.mean).__name__}, "
            f"kernel={type(self.kernel).__name__}, params={list(self.names)})"
        )
