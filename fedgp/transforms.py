"""Data transforms: targets standardised and inputs scaled to the unit cube, computed federatedly.

A GP prior's defaults (a zero or constant mean, outputscale and noise near one, lengthscales near
one) describe standardised data. Raw targets of scale 100 and offset 150 leave the mean stuck far
from the data and the predictive intervals far too narrow, silently. BoTorch therefore
standardises outcomes by default (``Standardize``) and asks for inputs in the unit cube
(``Normalize``); fedgp does the same, without pooling the data:

1. Before training, the server sends every client a ``summarise`` task, twice. A client replies
   with its count and Σy, then with Σ(y − ȳ)² about the federation's mean: *summed* fields, the
   server sees only their totals. For federated input normalisation only, it also sends its
   per-feature bounding box, widened outward to a coarse grid so that no data value leaves
   (individual fields: the server learns each client's box to about 1/16 of its width; give
   ``Normalize(bounds=...)`` to reveal nothing about the inputs).
2. The server forms the global mean and standard deviation and the unit-cube map
   (:func:`learn`), and sends them with every later task: two ``(d,)`` and two scalar tensors.
3. Each client applies them to its own data where it is hosted, and maps its predictions and test
   metrics back to the original units before they leave (:mod:`fedgp.engines.base`,
   :mod:`fedgp.engines.client`). So every engine, in process, on Ray or on Flower, transforms the
   same way, and every number a user reads is in the original units.

Back to the data's units is one method for predictions, metrics (or replies) and states alike,
:meth:`DataTransform.untransform`, which every place that maps values back calls.

``Standardize(local=True)`` standardises each client with its own mean and standard deviation
instead (nothing about the targets leaves); a client's predictions are mapped back with its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gpytorch
import numpy as np
import torch

from fedgp import transformed
from fedgp.data.client import ClientData
from fedgp.errors import InputError, InputTypeError
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.models.state import HyperState
from fedgp.models.units import outcome_at_rows, outcome_in_units, state_in_units
from fedgp.summaries import client_summaries, outward_bounds, own_outcome_maps, power_of_two

__all__ = [
    "Transforms",
    "Standardize",
    "Normalize",
    "DataTransform",
    "learn",
    "auto_outcome",
    "SCALE_SPREAD",
    "client_summaries",
    "outward_bounds",
]

#: Names under which a transform travels in the ``transform`` task's shared record.
PREFIX = "transform/"


@dataclass(frozen=True)
class Standardize:
    """Outcome transform ``y ↦ (y − mean) / sd`` (BoTorch's ``Standardize``; sd with ddof = 1).

    ``local=False``: the mean and sd of all clients' training targets, from summed counts, sums
    and sums of squares. ``local=True``: each client uses its own (a client with one point keeps
    sd 1, one with none mean 0 and sd 1).
    """

    local: bool = False
    #: T > 0: one mean and sd per output of a multi-output spec (``fit`` sets it for such a spec).
    outputs: int = 0

    def describe(self) -> str:
        """A short description for ``result.transforms``."""
        if self.outputs:
            return "standardize (each output: the federation's mean and sd)"
        return "standardize (each client's own mean and sd)" if self.local else "standardize (federated)"


@dataclass(frozen=True)
class Normalize:
    """Input transform ``x ↦ (x − lower) / (upper − lower)``: the unit cube (BoTorch's ``Normalize``).

    ``bounds``: known ``(2, d)`` lower and upper bounds (nothing about the inputs leaves a client);
    ``None``: the federation's box: the union of the clients' boxes, each widened to a grid of
    about 1/16 of its width (:func:`outward_bounds`), so the data lie strictly inside the cube.
    ``hide_discrete``: a widened end still pins an integer-valued feature's extreme (it is the one
    integer just inside the grid point); with ``True`` each client moves each end of such a feature
    out by 0 to 3 further grid steps (of at least 1, so that each passes an integer), chosen by a
    hash of its own data (:func:`fedgp.summaries.hidden_steps`): the integer just inside is the
    extreme for 1 end in 4 (measured: 25.0 % of 8,000 ends). Fedgp's Flower app turns it on.
    ``task_column``: the last column is an output index (a
    :class:`~fedgp.models.multioutput.MultiOutputSpec`'s), left as it is; ``fit`` sets it for such a spec.
    """

    bounds: Any = None
    hide_discrete: bool = False
    task_column: bool = False

    def __post_init__(self) -> None:
        if self.bounds is None:
            return
        bounds = torch.as_tensor(np.asarray(self.bounds, dtype=np.float64))
        if bounds.dim() != 2 or bounds.shape[0] != 2:
            raise InputError(f"Normalize bounds must have shape (2, d), got {tuple(bounds.shape)}")
        if not bool(torch.isfinite(bounds).all()):
            raise InputError("Normalize bounds must be finite")
        if not bool((bounds[1] > bounds[0]).all()):
            bad = torch.nonzero(bounds[1] <= bounds[0]).flatten().tolist()
            raise InputError(f"Normalize bounds: upper must exceed lower for every feature; not for {bad}")
        object.__setattr__(self, "bounds", bounds)

    def describe(self) -> str:
        """A short description for ``result.transforms``."""
        return "normalize (known bounds)" if self.bounds is not None else "normalize (federated min/max)"


@dataclass(frozen=True)
class DataTransform:
    """The learned transforms, as the ``transform`` task carries them to the clients once per run.

    ``x_offset``/``x_scale`` ``(d,)``: inputs become ``(x − x_offset) / x_scale``; ``None`` leaves
    them alone. ``y_offset``/``y_scale`` (scalars): targets become ``(y − y_offset) / y_scale``;
    ``y_local``: each client uses its own instead; both ``None`` and not local leaves them alone.
    ``(T,)`` tensors (:attr:`per_output`): a multi-output spec's row of output t maps by entry t.
    """

    x_offset: torch.Tensor | None = None
    x_scale: torch.Tensor | None = None
    y_offset: torch.Tensor | None = None
    y_scale: torch.Tensor | None = None
    y_local: bool = False
    note: str = ""  # what ``"auto"`` decided and why (for the history; never travels)

    @property
    def per_output(self) -> bool:
        """Whether the targets map per output (the output index in X's last column)."""
        return self.y_offset is not None and self.y_offset.dim() == 1

    def row_maps(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(offset, scale)`` of each row of ``X`` under a per-output map (by X's last column)."""
        task = X[..., -1].long()
        return self.y_offset.to(torch.float64)[task], self.y_scale.to(torch.float64)[task]

    @property
    def is_identity(self) -> bool:
        """Whether the transform changes nothing."""
        return self.x_offset is None and self.y_offset is None and not self.y_local

    # -- travelling in a task ------------------------------------------------------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        """The transform's tensors as the ``transform`` task carries them."""
        out = {}
        for name in ("x_offset", "x_scale", "y_offset", "y_scale"):
            value = getattr(self, name)
            if value is not None:
                out[PREFIX + name] = value.to(torch.float64)
        return out

    def settings(self) -> dict[str, bool]:
        """The transform's plain settings as the ``transform`` task carries them."""
        return {PREFIX + "y_local": True} if self.y_local else {}

    @classmethod
    def from_parts(cls, tensors: Mapping[str, torch.Tensor], settings: Mapping[str, Any]) -> DataTransform:
        """Read the transform of a task's shared record (identity when it carries none)."""
        values = {n: tensors.get(PREFIX + n) for n in ("x_offset", "x_scale", "y_offset", "y_scale")}
        return cls(**values, y_local=bool(settings.get(PREFIX + "y_local", False)))

    def key(self) -> tuple:
        """Equal for equal transforms (engines re-transform their data only when this changes)."""
        tensors = self.tensors()
        return (tuple(tensors), tuple(tuple(v.reshape(-1).tolist()) for v in tensors.values()), self.y_local)

    # -- applied by a client ----------------------------------------------------------------------------
    def outcome_map(self, y: torch.Tensor) -> tuple[float, float]:
        """``(offset, scale)`` of the outcome transform for a client with training targets ``y``."""
        if self.y_local:
            offsets, scales = own_outcome_maps([y])
            return float(offsets[0]), float(scales[0])
        if self.y_offset is None or self.per_output:  # per output: each row's own (row_maps)
            return 0.0, 1.0
        return float(self.y_offset), float(self.y_scale)

    def inputs(self, X: torch.Tensor) -> torch.Tensor:
        """Inputs in the transformed units."""
        if self.x_offset is None:
            return X
        width = self.x_offset.shape[-1]
        if X.shape[-1] > width:  # an owner's own columns after the core, in its own units (own_features)
            return torch.cat([self.inputs(X[..., :width]), X[..., width:]], -1)
        return (X - self.x_offset.to(X)) / self.x_scale.to(X)

    def apply(self, client: ClientData) -> tuple[ClientData, float, float]:
        """The client's data in transformed units, with its outcome ``(offset, scale)``."""
        made, offsets, scales = self.apply_all([client])
        return made[0], float(offsets[0]), float(scales[0])

    def apply_all(self, clients: Sequence[ClientData]) -> tuple[list[ClientData], torch.Tensor, torch.Tensor]:
        """Every client's data in transformed units, with the outcome offsets and scales ``(K,)``
        (:func:`fedgp.transformed.apply_all`)."""
        return transformed.apply_all(self, clients)

    def lazy_all(
        self, clients: Sequence[ClientData]
    ) -> tuple[Sequence[ClientData], torch.Tensor, torch.Tensor]:
        """:meth:`apply_all`, each client's data made when first read (:func:`fedgp.transformed.lazy_all`)."""
        return transformed.lazy_all(self, clients)

    def outcome_maps(self, clients: Sequence[ClientData]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's outcome map ``y = offset + scale·y'``: ``(K,)`` offsets and scales."""
        return transformed.outcome_maps(self, clients)

    def stacked(
        self, clients: Sequence[ClientData], X, y, sizes, offsets, scales
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every client's training rows end to end, mapped in place (:func:`fedgp.transformed.stacked`)."""
        return transformed.stacked(self, clients, X, y, sizes, offsets, scales)

    def describe(self) -> dict[str, Any]:
        """What was applied, for ``FitResult.transforms`` and the history."""
        out: dict[str, Any] = {}
        if self.y_local:
            out["outcome"] = "standardize, each client's own mean and sd"
        elif self.per_output:
            means, sds = _fmt(self.y_offset.tolist()), _fmt(self.y_scale.tolist())
            out["outcome"] = f"standardize each output, means {means}, sds {sds}"
        elif self.y_offset is not None:
            out["outcome"] = f"standardize, mean {float(self.y_offset):.6g}, sd {float(self.y_scale):.6g}"
        else:
            out["outcome"] = "none"
        if self.x_offset is not None:
            lower = self.x_offset.tolist()
            upper = (self.x_offset + self.x_scale).tolist()
            out["inputs"] = f"normalize to the unit cube from lower {_fmt(lower)}, upper {_fmt(upper)}"
        else:
            out["inputs"] = "none"
        if self.note:
            out["note"] = self.note
        return out

    # -- back to the data's units ------------------------------------------------------------------
    def untransform(self, value: Any, offset: Any = None, scale: Any = None, *, partial: bool = False) -> Any:
        """``value`` (a :class:`~fedgp.models.posterior.Prediction`, a mapping of test metrics or of
        ``predict`` reply fields, or a :class:`~fedgp.models.state.HyperState`), computed on
        transformed data, in the data's own units, as BoTorch's ``untransform_posterior`` (the maps:
        :mod:`fedgp.models.units`). ``offset``/``scale``: the outcome map ``y = offset + scale·y'``,
        default the transform's own (``0``/``1`` without one); under ``y_local`` the client's
        (``outcome_map(client.y)``); ``(k,)`` tensors map k clients' stacked values, each its own.

        A client's replies (``offset``, ``scale``: the engine's ``(k,)`` outcome maps of its clients)::

            reply = transform.untransform(  # predict: the stacked predictions, (k, points[, points])
                {"mean": M, "variance_f": Vf, "variance_y": Vy, "covariance_f": C, "mean_f": F},
                offset, scale)                # covariance_f and mean_f only where present
            metrics = transform.untransform(metrics, offset, scale)  # evaluate: (k,) each

        which have the bits of ``M.double() * scale[:, None] + offset[:, None]``,
        ``Vf.double() * (scale * scale)[:, None]``, ``rmse * scale`` and ``nll + scale.log()``.

        A state's hyper-parameters without an exact map (another kernel's; in y's units under
        ``y_local`` without ``offset``/``scale``) are refused, naming them; ``partial=True`` leaves
        them out. Tensors come back float64, numbers as Python floats."""
        if not isinstance(value, HyperState):
            return outcome_in_units(value, *self._outcome(offset, scale))
        # y's map: each client's own, or each output's (no single map for a shared noise)
        unknown = (self.y_local and offset is None and scale is None) or self.per_output
        o, s = (None, None) if unknown else self._outcome(offset, scale)
        state, left = state_in_units(value, o, s, self.x_offset, self.x_scale)
        if left and not partial:
            named = "; ".join(f"{name} ({why})" for name, why in left.items())
            raise InputError(f"untransform: {named}; pass partial=True to leave them out")
        return state

    def untransform_rows(self, value: Any, X: torch.Tensor) -> Any:
        """``value`` (a Prediction, or ``predict`` reply fields with the points last) at the rows ``X``
        (the output index last), each point mapped back by its output's map (identity without one)."""
        if not self.per_output:
            return self.untransform(value)
        return outcome_at_rows(value, *self.row_maps(X))

    def _outcome(self, offset: Any, scale: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The outcome map ``(offset, scale)`` as float64 tensors: the given one or the transform's."""
        if self.per_output:
            raise InputError(
                "untransform: the targets were standardised per output; map values at rows with "
                "transform.untransform_rows(value, X)"
            )
        if offset is None and scale is None:
            if self.y_local:
                raise InputError(
                    "untransform: each client standardised its targets with its own mean and sd "
                    "(Standardize(local=True)); pass that client's offset and scale "
                    "(transform.outcome_map(client.y))"
                )
            offset, scale = (0.0, 1.0) if self.y_offset is None else (self.y_offset, self.y_scale)
        elif offset is None or scale is None:
            raise InputError("untransform: give both offset and scale (the map y = offset + scale * y')")
        return torch.as_tensor(offset, dtype=torch.float64), torch.as_tensor(scale, dtype=torch.float64)


def spread_unit(sums: Mapping[str, torch.Tensor], owners: int) -> float:
    """The unit of the ``spread`` stage's Σ((y − ȳ)/unit)²: the power of two at or below the
    owners' geometric mean sd when the summary carries their ``log_sd`` (``"auto"``), else 1 (the
    plain sum, which underflows for targets whose deviations are below about 1e-154)."""
    if "log_sd" not in sums or owners < 1:
        return 1.0
    geometric = torch.exp(sums["log_sd"].to(torch.float64) / owners).reshape(1)
    return float(power_of_two(geometric)[0])


#: Clients transformed together: bounds the transient copy of their rows (a few MB at 100 rows).


def _fmt(values: Sequence[float]) -> str:
    shown = ", ".join(f"{v:.4g}" for v in values[:6])
    return f"[{shown}{', ...' if len(values) > 6 else ''}]"


def _through_origin(spec) -> bool:
    """Whether the spec's mean is linear in x without a bias: shifting x or y changes that model."""
    return any(
        isinstance(m, gpytorch.means.LinearMean) and getattr(m, "bias", None) is None
        for m in spec.mean.modules()
    )


def _auto_reason(spec) -> str | None:
    """Why ``"auto"`` leaves this spec's data alone, or ``None`` (then it transforms them)."""
    fixed = [p.name for p in spec.params if not p.trainable]
    if fixed:
        return f"the spec fixes {', '.join(fixed)} in the data's units"
    if _through_origin(spec):
        return "the mean is linear without a bias (a shift would change the model)"
    return None


@dataclass(frozen=True)
class Transforms:
    """The data transforms of a run (``fit(..., transforms=...)``).

    ``outcome``: :class:`Standardize` (the federation's mean and sd, from summed counts and sums),
    ``Standardize(local=True)`` (each client's own), or ``None``. ``inputs``: :class:`Normalize`
    (the unit cube from the federation's min/max, or ``Normalize(bounds=...)``), or ``None``.
    ``"auto"`` (both defaults): ``Standardize()`` — federated, or each client's own when the owners'
    scales differ (:func:`auto_outcome`; ``result.transforms["note"]`` says which and why) — and
    ``Normalize()``, except when the spec fixes a
    hyper-parameter (its value is in the data's units) or its mean is linear without a bias
    (regression through the origin, which a shift would change): then none, and the history says
    why. Predictions, variances and metrics always come back in the original units; the learned
    hyper-parameters are in the transformed ones (``result.transform.untransform(result.state)``).
    """

    outcome: Standardize | str | None = "auto"
    inputs: Normalize | str | None = "auto"
    #: For the ``Normalize`` that ``inputs="auto"`` picks: :attr:`Normalize.hide_discrete`.
    hide_discrete: bool = False

    def __post_init__(self) -> None:
        if self.hide_discrete and self.inputs != "auto":
            raise InputError(
                "Transforms(hide_discrete=True) applies to inputs='auto'; with your own Normalize, "
                "set Normalize(hide_discrete=True)"
            )
        if not (self.outcome in (None, "auto") or isinstance(self.outcome, Standardize)):
            raise InputTypeError(
                f"Transforms(outcome=...) must be 'auto', fedgp.transforms.Standardize(...) or None, "
                f"got {self.outcome!r}"
            )
        if not (self.inputs in (None, "auto") or isinstance(self.inputs, Normalize)):
            raise InputTypeError(
                f"Transforms(inputs=...) must be 'auto', fedgp.transforms.Normalize(...) or None, "
                f"got {self.inputs!r}"
            )

    @classmethod
    def of(cls, transforms: Transforms | str | None) -> Transforms:
        """``fit``'s ``transforms`` argument as an object: ``"auto"``, ``None`` (none) or a ``Transforms``."""
        if isinstance(transforms, Transforms):
            return transforms
        if transforms == "auto":
            return cls()
        if transforms is None:
            return cls(None, None)
        raise InputTypeError(
            f"transforms must be 'auto', None or fedgp.transforms.Transforms(outcome=..., inputs=...), "
            f"got {transforms!r}"
        )

    def resolve(self, spec) -> tuple[Standardize | None, Normalize | None, str]:
        """``(outcome, inputs, note)`` for ``spec``: ``"auto"`` decided, and why it left the data
        alone if it did (``""`` otherwise)."""
        auto = "auto" in (self.outcome, self.inputs)
        reason = _auto_reason(spec) if auto else None
        outcome = (None if reason else Standardize()) if self.outcome == "auto" else self.outcome
        if not spec.conjugate:
            # Labels, counts, proportions are modelled as they are: a shifted label is no label.
            if outcome is not None and self.outcome != "auto":
                raise InputError(
                    f"a {type(spec.likelihood).__name__} models the targets as they are; "
                    "pass Transforms(outcome=None) (or 'auto'), not a Standardize"
                )
            outcome = None
        picked = None if reason else Normalize(hide_discrete=self.hide_discrete)
        inputs = picked if self.inputs == "auto" else self.inputs
        note = f"'auto' transforms nothing: {reason}" if reason else ""
        if isinstance(spec, MultiOutputSpec):
            outcome, inputs = _multi_output(outcome, inputs, spec.outputs)
        return outcome, inputs, note


def _multi_output(
    outcome: Standardize | None, inputs: Normalize | None, outputs: int
) -> tuple[Standardize | None, Normalize | None]:
    """A multi-output spec's transforms: the input features scaled, the output column (the last) left
    as it is, and each output standardised by its own federated mean and sd (one mean and sd of every
    output's targets would mix outputs of different units). Each client's own mean and sd is refused:
    with outputs missing at some owners it would be a different map per owner and output."""
    if outcome is not None and outcome.local:
        raise InputError(
            "Standardize(local=True) is not built for a MultiOutputSpec: its outputs are standardised "
            "by the federation's mean and sd of each output (Transforms(outcome=Standardize()) or 'auto'); "
            "under ClientDP, whose 'auto' picks each client's own, pass Transforms(outcome=None)"
        )
    outcome = None if outcome is None else replace(outcome, outputs=outputs)
    return outcome, None if inputs is None else replace(inputs, task_column=True)


#: ``"auto"`` standardises each owner by its own mean and sd when the standard deviation, across
#: owners, of the log of their targets' sd is above this (ln 2: owners' scales typically a factor
#: of 2 apart). Below it one federated mean and sd serve everyone. Chosen on the convergence
#: benchmark (``benchmarks/fgpr_heterogeneous.py``): see :func:`auto_outcome`.
SCALE_SPREAD = math.log(2.0)


def auto_outcome(sums: Mapping[str, torch.Tensor], owners: int) -> tuple[Standardize, str]:
    """``"auto"``'s outcome transform from the summed ``log_sd`` and ``log_sd_sq`` of ``owners``
    clients, and why. Owners whose targets differ in scale cannot share one outputscale and noise
    in one set of units: the benchmark's owners 100x apart got 95 % intervals covering none of the
    largest owners' test points under one federated sd."""
    mean = float(sums["log_sd"]) / owners
    spread = math.sqrt(max(float(sums["log_sd_sq"]) / owners - mean * mean, 0.0))
    local = spread > SCALE_SPREAD
    verdict = "each owner's own mean and sd" if local else "one federated mean and sd"
    return Standardize(local=local), (
        f"'auto' standardised the outcome by {verdict}: the owners' target sds spread by a factor of "
        f"{math.exp(spread):.3g} (geometric sd over {owners} owners; each their own above "
        f"{math.exp(SCALE_SPREAD):g})"
    )


def learn(
    outcome: Standardize | None,
    inputs: Normalize | None,
    sums: Mapping[str, torch.Tensor] | None,
    individual: Mapping[str, torch.Tensor] | None,
    d: int,
    unit: float = 1.0,
) -> DataTransform:
    """The server's side: the transforms from the summed statistics (``count``, ``y_sum``, and
    ``y_sumsq``: Σ((y − ȳ)/``unit``)² about the mean) and the clients' bounds (``x_min``, ``x_max``)."""
    fields: dict[str, Any] = {}
    if inputs is not None:
        if inputs.bounds is not None:
            if inputs.bounds.shape[1] != d:
                raise InputError(
                    f"Normalize bounds are for {inputs.bounds.shape[1]} features; the data have {d}"
                )
            lower, upper = inputs.bounds[0], inputs.bounds[1]
        else:
            lower, upper = individual["x_min"].min(0).values, individual["x_max"].max(0).values
        span = upper - lower
        offset, scale = lower.clone(), torch.where(span > 0, span, torch.ones_like(span))
        if inputs.task_column:  # the output index stays the integer the model reads
            offset[-1], scale[-1] = 0.0, 1.0
        fields.update(x_offset=offset, x_scale=scale)
    if outcome is not None and outcome.local:
        fields["y_local"] = True
    elif outcome is not None and outcome.outputs:
        fields.update(_per_output_maps(sums, unit))
    elif outcome is not None:
        n, mean, sqdev = (
            float(sums["count"]),
            float(sums["y_sum"]) / float(sums["count"]),
            float(sums["y_sumsq"]),
        )
        if n < 2:
            raise InputError("Standardize needs at least two training targets in the federation")
        sd = math.sqrt(sqdev / (n - 1)) * unit
        if not sd > 0:
            # Every client's targets vary (ClientData refuses constant ones), so a zero sum of
            # squared deviations is an underflow: the spread is below about 1e-154.
            raise InputError(
                "Standardize: the federation's targets vary too little to measure in float64 (their "
                f"squared deviations underflow to {sqdev:g}; mean {mean:.3g}); rescale y (multiply it "
                "by a large constant), use the default transforms='auto' (which measures the spread "
                "in the owners' own units) or pass Transforms(outcome=None)"
            )
        fields.update(
            y_offset=torch.tensor(mean, dtype=torch.float64), y_scale=torch.tensor(sd, dtype=torch.float64)
        )
    return DataTransform(**fields)


def _per_output_maps(sums: Mapping[str, torch.Tensor], unit: float) -> dict[str, torch.Tensor]:
    """Each output's mean and sd (ddof = 1) from its summed count, Σy and Σ((y − ȳ_t)/unit)²; an output
    with fewer than two targets in the federation (or none that differ) keeps sd 1, one with none mean 0."""
    n, total, sqdev = (sums[k].to(torch.float64) for k in ("count", "y_sum", "y_sumsq"))
    mean = torch.where(n > 0, total / n.clamp_min(1.0), torch.zeros_like(n))
    sd = (sqdev / (n - 1).clamp_min(1.0)).sqrt() * unit
    return {"y_offset": mean, "y_scale": torch.where((n > 1) & (sd > 0), sd, torch.ones_like(sd))}
