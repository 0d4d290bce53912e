"""A ``GPSpec`` as a declarative description: JSON that names modules, never code.

A saved result must rebuild its GPyTorch modules without pickle, and without importing whatever
class a file names. So a spec is written as a tree of class names from an allow-list (GPyTorch's
common kernels, means, likelihood, constraints and priors, and fedgp's own ``ZeroKernel`` and
``GaussianBumpMean``) with their constructor settings (``ard_num_dims``, ``nu``,
``active_dims``, ``batch_shape``, constraint bounds, prior parameters). Reading looks each name
up in the allow-list and refuses any other. GPyTorch has no such serialisation (its modules are
saved as ``state_dict`` next to code that rebuilds them), hence this module.

A :class:`~fedgp.models.multioutput.MultiOutputSpec` adds a ``multi_output`` entry: T, the rank,
the number of LMC terms and each term's ``IndexKernel`` (its constraint), and may name fedgp's
``TaskMean`` and ``OutputNoise``, which only such a spec reads (they index by X's last column).

Writing checks itself: the description is rebuilt and described again, and a spec whose modules
carry anything the description does not capture (a custom transform, a subclass, a closure) is
refused instead of being saved wrong.
"""

from __future__ import annotations

import math
from typing import Any

import gpytorch
import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.models import limits
from fedgp.models.means import GaussianBumpMean
from fedgp.models.multioutput import MultiOutputSpec, OutputNoise, TaskMean
from fedgp.models.spec import GPSpec, ZeroKernel

__all__ = [
    "describe_spec",
    "build_spec",
    "build_outputs",
    "KERNELS",
    "MEANS",
    "LIKELIHOODS",
    "CONSTRAINTS",
    "PRIORS",
]

_k, _m = gpytorch.kernels, gpytorch.means
#: Kernels with GPyTorch's common settings (ard_num_dims, batch_shape, active_dims, priors and
#: constraints of their own parameters) and the extra constructor arguments named here.
KERNELS: dict[str, tuple[type, tuple[str, ...]]] = {
    "RBFKernel": (_k.RBFKernel, ()),
    "MaternKernel": (_k.MaternKernel, ("nu",)),
    "LinearKernel": (_k.LinearKernel, ()),
    "PeriodicKernel": (_k.PeriodicKernel, ()),
    "RQKernel": (_k.RQKernel, ()),
    "PolynomialKernel": (_k.PolynomialKernel, ("power",)),
    "CosineKernel": (_k.CosineKernel, ()),
    "ZeroKernel": (ZeroKernel, ()),
    "ScaleKernel": (_k.ScaleKernel, ()),  # + base_kernel
    "AdditiveKernel": (_k.AdditiveKernel, ()),  # + kernels
    "ProductKernel": (_k.ProductKernel, ()),  # + kernels
}
#: Mean modules a saved spec may name.
MEANS: dict[str, type] = {
    "ZeroMean": _m.ZeroMean,
    "ConstantMean": _m.ConstantMean,
    "LinearMean": _m.LinearMean,
    "GaussianBumpMean": GaussianBumpMean,
    "TaskMean": TaskMean,  # a multi-output spec's only
}
#: Likelihoods a saved spec may name.
LIKELIHOODS: dict[str, type] = {
    "GaussianLikelihood": gpytorch.likelihoods.GaussianLikelihood,
    "OutputNoise": OutputNoise,  # a multi-output spec's only
}
#: What only a multi-output spec may name (each reads the output index in X's last column).
_TASK_MODULES = ("TaskMean", "OutputNoise")
#: Parameter constraints a saved spec may name.
CONSTRAINTS: dict[str, type] = {
    c.__name__: c
    for c in (
        gpytorch.constraints.Positive,
        gpytorch.constraints.GreaterThan,
        gpytorch.constraints.LessThan,
        gpytorch.constraints.Interval,
    )
}
_p = gpytorch.priors
#: Prior class -> (constructor argument, attribute holding it) pairs.
PRIORS: dict[str, tuple[type, tuple[tuple[str, str], ...]]] = {
    "GammaPrior": (_p.GammaPrior, (("concentration", "concentration"), ("rate", "rate"))),
    "NormalPrior": (_p.NormalPrior, (("loc", "loc"), ("scale", "scale"))),
    "LogNormalPrior": (_p.LogNormalPrior, (("loc", "loc"), ("scale", "scale"))),
    "HalfCauchyPrior": (_p.HalfCauchyPrior, (("scale", "scale"),)),
    "HalfNormalPrior": (_p.HalfNormalPrior, (("scale", "scale"),)),
    "UniformPrior": (_p.UniformPrior, (("a", "low"), ("b", "high"))),
    "SmoothedBoxPrior": (_p.SmoothedBoxPrior, (("a", "a"), ("b", "b"), ("sigma", "sigma"))),
}
#: Where GPyTorch registers a prior under a name other than its constructor argument.
_PRIOR_ARGUMENT = {("ConstantMean", "mean_prior"): "constant_prior"}


def _allowed(kind: str, table: dict) -> str:
    return f"{kind} allowed in a saved spec: {', '.join(sorted(table))}"


def _class_name(module: Any, table: dict, kind: str) -> str:
    name = type(module).__name__
    entry = table.get(name)
    cls = entry[0] if isinstance(entry, tuple) else entry
    if cls is not type(module):
        raise InputTypeError(
            f"cannot save a spec with a {type(module).__qualname__} {kind}; {_allowed(kind + 's', table)}"
        )
    return name


def _tensor(value: Any) -> Any:
    return torch.as_tensor(value).detach().cpu().tolist()


# -- describe ---------------------------------------------------------------------------------------
def _describe_constraint(constraint) -> dict:
    name = _class_name(constraint, CONSTRAINTS, "constraint")
    transform = constraint._transform
    label = getattr(transform, "__qualname__", None)
    out: dict[str, Any] = {
        "class": name,
        "transform": repr(transform) if label is None else f"{transform.__module__}.{label}",
    }
    if name in ("GreaterThan", "Interval"):
        out["lower_bound"] = _tensor(constraint.lower_bound)
    if name in ("LessThan", "Interval"):
        out["upper_bound"] = _tensor(constraint.upper_bound)
    if constraint._initial_value is not None:
        out["initial_value"] = _tensor(constraint._initial_value)
    return out


def _describe_prior(prior) -> dict:
    name = _class_name(prior, PRIORS, "prior")
    if getattr(prior, "_transform", None) is not None:
        raise InputTypeError(
            f"cannot save a {name} with a transform; only untransformed priors are described"
        )
    return {"class": name, **{arg: _tensor(getattr(prior, attr)) for arg, attr in PRIORS[name][1]}}


def _extras(module, owner: str | None = None) -> dict:
    """The constructor arguments for the priors and constraints registered on ``module``."""
    owner = type(module).__name__ if owner is None else owner
    out: dict[str, Any] = {}
    for name, constraint in module._constraints.items():
        out[name.removeprefix("raw_")] = _describe_constraint(constraint)
    for name, (prior, *_closures) in module._priors.items():
        out[_PRIOR_ARGUMENT.get((owner, name), name)] = _describe_prior(prior)
    return out


def _batch(module) -> list[int]:
    return list(getattr(module, "batch_shape", ()) or ())


def describe_kernel(kernel) -> dict:
    name = _class_name(kernel, KERNELS, "kernel")
    active = kernel.active_dims
    out: dict[str, Any] = {
        "class": name,
        "ard_num_dims": kernel.ard_num_dims,
        "batch_shape": _batch(kernel),
        "active_dims": None if active is None else _tensor(active),
        **{arg: getattr(kernel, arg) for arg in KERNELS[name][1]},
        **_extras(kernel),
    }
    if name == "ScaleKernel":
        out["base_kernel"] = describe_kernel(kernel.base_kernel)
    if name in ("AdditiveKernel", "ProductKernel"):
        out["kernels"] = [describe_kernel(k) for k in kernel.kernels]
    return out


def describe_mean(mean) -> dict:
    name = _class_name(mean, MEANS, "mean")
    out: dict[str, Any] = {"class": name, "batch_shape": _batch(mean), **_extras(mean)}
    if name == "LinearMean":
        out["batch_shape"] = list(mean.weights.shape[:-2])
        out.update(input_size=int(mean.weights.shape[-2]), bias=mean.bias is not None)
    elif name == "GaussianBumpMean":
        out.update(batch_shape=list(mean.weights.shape[:-2]), centres=_tensor(mean.centres), width=mean.width)
    elif name == "ConstantMean":
        out["batch_shape"] = list(mean.constant.shape)
    elif name == "ZeroMean":
        out["batch_shape"] = list(mean.batch_shape)
    elif name == "TaskMean":
        out["outputs"] = int(mean.constant.shape[-1])
    return out


def describe_likelihood(likelihood) -> dict:
    name = _class_name(likelihood, LIKELIHOODS, "likelihood")
    noise = likelihood.noise_covar
    if likelihood._constraints or likelihood._priors:
        raise InputTypeError("cannot save a likelihood with priors or constraints outside its noise model")
    out = {"class": name, "batch_shape": list(noise.raw_noise.shape[:-1]), **_extras(noise)}
    if name == "OutputNoise":
        out["outputs"] = int(noise.raw_noise.shape[-1])
    return out


def _task_kernels(spec: MultiOutputSpec) -> list:
    """The spec's task covariance modules, one per LMC term."""
    task = spec._template.task_covar_module
    return list(task) if spec.terms > 1 else [task]


def describe_task_kernel(kernel) -> dict:
    """An ``IndexKernel``'s settings: T and rank from its W, and its constraint (priors are refused:
    :class:`MultiOutputSpec` builds its task covariance without one, so none could be rebuilt)."""
    if type(kernel) is not gpytorch.kernels.IndexKernel:
        raise InputTypeError(
            f"cannot save a spec whose task covariance is a {type(kernel).__qualname__}; a saved "
            "multi-output spec's is GPyTorch's IndexKernel, as MultiOutputSpec builds it"
        )
    if kernel._priors:
        raise InputTypeError("cannot save a task covariance (IndexKernel) with a prior")
    outputs, rank = kernel.covar_factor.shape[-2:]
    return {"class": "IndexKernel", "num_tasks": int(outputs), "rank": int(rank), **_extras(kernel)}


def describe_outputs(spec: MultiOutputSpec) -> dict:
    """A multi-output spec's task structure: T, the rank, the LMC terms Q and each term's kernel."""
    return {
        "outputs": spec.outputs,
        "rank": spec.rank,
        "terms": spec.terms,
        "task_kernels": [describe_task_kernel(k) for k in _task_kernels(spec)],
    }


def describe_spec(spec: GPSpec) -> dict:
    """The spec's module structure and settings as JSON-able data (values travel separately)."""
    out = {
        "kernel": describe_kernel(spec.kernel),
        "mean": describe_mean(spec.mean),
        "likelihood": describe_likelihood(spec.likelihood),
        "dtype": str(spec.dtype).removeprefix("torch."),
        "fixed": [p.name for p in spec.params if not p.trainable],
    }
    if isinstance(spec, MultiOutputSpec):
        out["multi_output"] = describe_outputs(spec)
    return out


# -- build ----------------------------------------------------------------------------------------
def _lookup(table: dict, name: Any, kind: str):
    if not isinstance(name, str) or name not in table:
        allowed = _allowed(f"{kind}s", table)
        raise InputError(f"saved spec names {kind} class {name!r}, which is not on the allow-list; {allowed}")
    return table[name]


def _number(value: Any, where: str) -> torch.Tensor:
    try:
        out = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"saved spec: {where} must be numbers, got {value!r}") from None
    return out


def _build_constraint(desc: dict):
    cls = _lookup(CONSTRAINTS, desc.get("class"), "constraint")
    bounds = [_number(desc[k], f"constraint {k}") for k in ("lower_bound", "upper_bound") if k in desc]
    initial = desc.get("initial_value")
    kwargs = {} if initial is None else {"initial_value": _number(initial, "constraint initial_value")}
    return cls(*bounds, **kwargs)


def _build_prior(desc: dict):
    cls, args = _lookup(PRIORS, desc.get("class"), "prior")
    return cls(**{arg: _number(desc[arg], f"prior {arg}") for arg, _ in args})


def _build_extras(desc: dict) -> dict:
    out = {}
    for key, value in desc.items():
        if key.endswith("_constraint"):
            out[key] = _build_constraint(value)
        elif key.endswith("_prior"):
            out[key] = _build_prior(value)
    return out


def _ints(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"saved spec: {where} must be a list of ints, got {value!r}")
    return tuple(value)


def _node(desc: Any, where: str) -> dict:
    if not isinstance(desc, dict):
        got = type(desc).__name__
        raise InputError(f"saved spec: {where} must be a JSON object naming a class, got {got}")
    return desc


def _batch_shape(desc: dict, where: str, per_element: int = 1) -> torch.Size:
    """``desc``'s batch shape, within :mod:`fedgp.models.limits` for ``per_element`` numbers each."""
    batch = limits.shape(desc.get("batch_shape", []), f"{where}.batch_shape")
    if math.prod(batch) * per_element > limits.MAX_PARAMETER_ELEMENTS:
        raise InputError(
            f"saved spec: {where} implies a parameter of {math.prod(batch) * per_element} numbers "
            f"(batch_shape {list(batch)} x {per_element}); the limit is {limits.MAX_PARAMETER_ELEMENTS}"
        )
    return torch.Size(batch)


def _kernel_arguments(desc: dict, name: str, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arg in KERNELS[name][1]:
        value = desc.get(arg)
        if arg == "nu" and (isinstance(value, bool) or value not in (0.5, 1.5, 2.5)):
            raise InputError(f"saved spec: {where}.nu must be 0.5, 1.5 or 2.5, got {value!r}")
        out[arg] = limits.integer(value, f"{where}.{arg}", 1, 100) if arg == "power" else value
    return out


def build_kernel(desc: dict, where: str = "spec.kernel") -> gpytorch.kernels.Kernel:
    """The kernel a description names (``where``: its place, for error messages)."""
    cls, extra = _lookup(KERNELS, _node(desc, where).get("class"), "kernel")
    name = desc["class"]
    if name in ("AdditiveKernel", "ProductKernel"):
        parts = desc.get("kernels")
        if not isinstance(parts, list) or not parts:
            raise InputError(f"saved spec: {where}.kernels must be a non-empty list of kernels")
        return cls(*[build_kernel(k, f"{where}.kernels[{i}]") for i, k in enumerate(parts)])
    kwargs: dict[str, Any] = {**_build_extras(desc), **_kernel_arguments(desc, name, where)}
    ard = desc.get("ard_num_dims")
    if ard is not None:
        kwargs["ard_num_dims"] = limits.integer(ard, f"{where}.ard_num_dims", 1, limits.MAX_INPUT_DIMS)
    kwargs["batch_shape"] = _batch_shape(desc, where, ard or 1)
    if desc.get("active_dims") is not None:
        active = desc["active_dims"]
        if not isinstance(active, list) or not 0 < len(active) <= limits.MAX_INPUT_DIMS:
            most = limits.MAX_INPUT_DIMS
            raise InputError(f"saved spec: {where}.active_dims must be a list of 1 to {most} dimensions")
        where_a = f"{where}.active_dims"
        kwargs["active_dims"] = tuple(
            limits.integer(v, f"{where_a}[{i}]", 0, limits.MAX_INPUT_DIMS) for i, v in enumerate(active)
        )
    if name == "ScaleKernel":
        return cls(build_kernel(desc.get("base_kernel"), f"{where}.base_kernel"), **kwargs)
    return cls(**kwargs)


def build_mean(desc: dict, where: str = "spec.mean") -> gpytorch.means.Mean:
    """The mean module a description names (``where``: its place, for error messages)."""
    cls = _lookup(MEANS, _node(desc, where).get("class"), "mean")
    name = desc["class"]
    if name == "LinearMean":
        size = limits.integer(desc.get("input_size"), f"{where}.input_size", 1, limits.MAX_INPUT_DIMS)
        bias = limits.boolean(desc.get("bias"), f"{where}.bias")
        return cls(size, batch_shape=_batch_shape(desc, where, size), bias=bias)
    if name == "GaussianBumpMean":
        centres = _number(desc.get("centres"), f"{where}.centres")
        width = limits.positive(desc.get("width"), f"{where}.width")
        return cls(centres, width, tuple(_batch_shape(desc, where, max(centres.numel(), 1))))
    if name == "TaskMean":
        return cls(limits.integer(desc.get("outputs"), f"{where}.outputs", 1, limits.MAX_OUTPUTS))
    return cls(batch_shape=_batch_shape(desc, where), **_build_extras(desc))


def build_likelihood(desc: dict, where: str = "spec.likelihood") -> gpytorch.likelihoods.Likelihood:
    """The likelihood a description names (``where``: its place, for error messages)."""
    cls = _lookup(LIKELIHOODS, _node(desc, where).get("class"), "likelihood")
    if desc["class"] == "OutputNoise":
        outputs = limits.integer(desc.get("outputs"), f"{where}.outputs", 1, limits.MAX_OUTPUTS)
        return cls(outputs, batch_shape=_batch_shape(desc, where, outputs), **_build_extras(desc))
    return cls(batch_shape=_batch_shape(desc, where), **_build_extras(desc))


def _count_modules(desc: Any) -> int:
    """How many modules (JSON objects naming a ``class``) a description holds, without recursion."""
    count, stack = 0, [desc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            count += "class" in node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def build_spec(desc: dict, initial_values: dict[str, torch.Tensor] | None = None) -> GPSpec:
    """The ``GPSpec`` a description names, with ``initial_values`` (constrained) as its template."""
    if not isinstance(desc, dict) or not {"kernel", "mean", "likelihood"} <= set(desc):
        raise InputError("saved spec must be a mapping with 'kernel', 'mean' and 'likelihood'")
    modules = _count_modules(desc)
    if modules > limits.MAX_SPEC_MODULES:
        most = limits.MAX_SPEC_MODULES
        raise InputError(f"saved spec names {modules} modules, constraints and priors; the limit is {most}")
    fixed = desc.get("fixed", [])
    if not isinstance(fixed, list) or not all(isinstance(f, str) for f in fixed):
        raise InputError(f"saved spec: spec.fixed must be a list of parameter names, got {fixed!r}")
    dtype = _DTYPES.get(desc.get("dtype", "float64"))
    if dtype is None:
        raise InputError(f"saved spec: dtype must be one of {sorted(_DTYPES)}, got {desc.get('dtype')!r}")
    mean, likelihood = build_mean(desc["mean"]), build_likelihood(desc["likelihood"])
    options = dict(initial_values=initial_values, fixed=list(fixed), dtype=dtype)
    if desc.get("multi_output") is not None:
        return build_outputs(desc, mean, likelihood, options)
    for module, where in ((mean, "spec.mean"), (likelihood, "spec.likelihood")):
        if type(module).__name__ in _TASK_MODULES:
            raise InputError(
                f"saved spec: {where} is a {type(module).__name__}, which reads the output index of a "
                "multi-output spec, but the spec has no multi_output entry"
            )
    return GPSpec(build_kernel(desc["kernel"]), mean, likelihood, **options)


def build_outputs(desc: dict, mean, likelihood, options: dict) -> MultiOutputSpec:
    """The :class:`MultiOutputSpec` a description with a ``multi_output`` entry names: T, rank and
    terms checked first, the mean's and likelihood's T against it, and the task kernels against the
    ones the spec builds (it builds them itself; a description of others is refused, not ignored)."""
    where = "spec.multi_output"
    tasks = desc["multi_output"]
    if not isinstance(tasks, dict):
        got = type(tasks).__name__
        raise InputError(
            f"saved spec: {where} must be a JSON object (outputs, rank, terms, task_kernels), got {got}"
        )
    outputs = limits.integer(tasks.get("outputs"), f"{where}.outputs", 1, limits.MAX_OUTPUTS)
    rank = limits.integer(tasks.get("rank"), f"{where}.rank", 0, outputs)
    terms = limits.integer(tasks.get("terms"), f"{where}.terms", 1, limits.MAX_SPEC_MODULES)
    for module, name in ((mean, "spec.mean"), (likelihood, "spec.likelihood")):
        if type(module).__name__ in _TASK_MODULES:
            got = int(desc[name.removeprefix("spec.")]["outputs"])
            if got != outputs:
                raise InputError(f"saved spec: {name}.outputs is {got}, but {where}.outputs is {outputs}")
    kernel: Any = build_kernel(desc["kernel"])
    if terms > 1:
        parts = getattr(kernel, "kernels", None)
        if type(kernel) is not gpytorch.kernels.AdditiveKernel or len(parts) != terms:
            raise InputError(
                f"saved spec: {where}.terms is {terms}, so spec.kernel must be an AdditiveKernel of "
                f"{terms} kernels (one per LMC term), got {desc['kernel'].get('class')!r}"
            )
        kernel = list(parts)
    spec = MultiOutputSpec(kernel, mean, likelihood, outputs=outputs, rank=rank, **options)
    saved = tasks.get("task_kernels")
    built = [describe_task_kernel(k) for k in _task_kernels(spec)]
    if saved != built:
        raise InputError(
            f"saved spec: {where}.task_kernels must be the {terms} IndexKernel(s) of T={outputs}, "
            f"rank {rank} that MultiOutputSpec builds ({built}), got {limits.shown(saved)}"
        )
    return spec


def check_round_trip(spec: GPSpec) -> dict:
    """``describe_spec(spec)``, after checking that building it gives back the same spec."""
    if spec.variational:
        raise InputTypeError(
            f"cannot save {spec!r}: saved models and the Flower app take exact GPs (fedgp.GPSpec) only, "
            "for now; keep the variational run's state with result.state"
        )
    desc = describe_spec(spec)
    rebuilt = build_spec(desc, dict(spec.initial_state()))
    same = type(rebuilt) is type(spec) and describe_spec(rebuilt) == desc
    if not same or rebuilt.event_shapes != spec.event_shapes:
        raise InputTypeError(
            f"cannot save {spec!r}: its modules carry settings the saved description does not "
            "capture (a custom constraint transform or an unusual constructor argument)"
        )
    if not rebuilt.initial_state().allclose(spec.initial_state(), rtol=0.0):
        raise InputTypeError(f"cannot save {spec!r}: its initial values do not survive being rebuilt")
    return desc
