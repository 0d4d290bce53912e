"""The declared reply of every task kind that is not a strategy's training round.

``hello`` (registration), ``summarise`` (the data transforms' statistics), ``evaluate`` (test
metrics), ``predict`` (a posterior at given inputs) and ``personal`` (the state a client would
condition on) have replies fixed by the protocol; a ``train`` reply is what the strategy's
``configure`` declares.
"""

from __future__ import annotations

import torch

from fedgp.errors import InputError
from fedgp.messages.fields import Field, state_fields
from fedgp.models.spec import GPSpec

__all__ = ["HELLO_FIELDS", "EVALUATE_FIELDS", "reply_fields", "summary_fields"]

#: What a client reports about itself when it registers: training size, test size, input dimension.
HELLO_FIELDS = {"n": Field((), torch.long), "n_test": Field((), torch.long), "d": Field((), torch.long)}
#: Per-client test metrics: computed on the client, only these numbers travel.
EVALUATE_FIELDS = {
    "rmse": Field(),
    "nll": Field(),
    "coverage95": Field(),
    "n_test": Field((), torch.long),
    "cluster": Field((), torch.long),
}


def reply_fields(
    kind: str, spec: GPSpec, num_clusters: int, points: int = 0, full_cov: bool = False
) -> dict[str, Field]:
    """The declared reply of the non-training tasks (``predict`` with ``full_cov``: the joint
    covariance of f at the ``points`` inputs too)."""
    if kind == "hello":
        return dict(HELLO_FIELDS)
    if kind == "summarise":
        raise InputError("summarise replies depend on the data's width and the stage: use summary_fields")
    if kind == "evaluate":
        # The spec's own metrics (EVALUATE_FIELDS' for a Gaussian likelihood), the size and the cluster.
        metrics = {name: Field() for name in spec.metric_names}
        fields = {**metrics, "n_test": EVALUATE_FIELDS["n_test"], "cluster": EVALUATE_FIELDS["cluster"]}
    elif kind == "predict":
        fields = {"mean": Field((points,)), "variance_f": Field((points,)), "variance_y": Field((points,))}
        if not spec.conjugate:  # mean is E[y]; the latent f's mean travels too
            fields["mean_f"] = Field((points,))
        if full_cov:
            fields["covariance_f"] = Field((points, points))
    elif kind == "personal":
        fields = {**state_fields(spec, "state/"), "cluster": Field((), torch.long)}
    else:
        raise InputError(f"no fixed reply for {kind!r} tasks: the strategy declares it")
    if "cluster" in fields:
        fields["cluster"] = Field((), torch.long, bounds=(0, num_clusters - 1))
    return fields


def summary_fields(d: int, stage: str, bounds: bool = False, scales: bool = False) -> dict[str, Field]:
    """What a client replies to ``summarise`` (:mod:`fedgp.transforms`). Stage ``"mean"``: its count
    and Σy (summed), its own per-feature minimum and maximum when the server learns the input
    bounds (individual), and with ``scales`` the log of its targets' sd and its square (summed:
    how much the owners' scales differ, for ``"auto"``). Stage ``"spread"``: Σ(y − ȳ)² about the
    federation's mean ȳ (summed) — two passes, because Σy² − nȳ² would lose about
    2·log10(|ȳ|/sd) of float64's 16 digits to cancellation."""
    if stage == "spread":
        return {"y_sumsq": Field((), torch.float64, summed=True)}
    fields = {"count": Field((), torch.float64, summed=True), "y_sum": Field((), torch.float64, summed=True)}
    if bounds:
        fields.update(x_min=Field((d,)), x_max=Field((d,)))
    if scales:
        summed = Field((), torch.float64, summed=True)
        fields.update(log_sd=summed, log_sd_sq=summed)
    return fields
