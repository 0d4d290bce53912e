"""Task kinds: what the server may ask of a client, one object per kind.

A kind holds its whole protocol in one place: the reply it declares (:meth:`TaskKind.fields`), how
a client answers it from its own data (:meth:`TaskKind.answer`), and what a failed exchange of it
leaves undone (:attr:`TaskKind.undone`, for the error that says so). :func:`handle` — the client
side of every engine — dispatches on the object::

    hello      report your sizes and width              (registration)
    summarise  counts and sums for the data transforms  (before round 1)
    transform  hold your data in the run's units         (once per run, after summarise)
    train      the strategy's local update              (every round; declared by the strategy)
    evaluate   test metrics under your personal state
    predict    your posterior at given inputs
    personal   the state you would condition on

Simulated failures and attacks are not here: they wrap the client's operations where the engine
builds them (:meth:`fedgp.engines.base.InProcessEngine.client_ops`), so a kind's answer is the
honest client's.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from fedgp.errors import InputError
from fedgp.messages import Field, Task, state_fields, state_tensors
from fedgp.models.posterior import prediction_metrics
from fedgp.models.spec import GPSpec
from fedgp.strategies.base import ClientOps, Strategy
from fedgp.transforms import DataTransform, client_summaries

__all__ = [
    "TaskKind",
    "KINDS",
    "handle",
    "reply_fields",
    "summary_fields",
    "HELLO_FIELDS",
    "EVALUATE_FIELDS",
]

Units = tuple[torch.Tensor, torch.Tensor]

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


class TaskKind:
    """One kind of task: its name on the wire, its declared reply, a client's answer, and what a
    failed exchange of it leaves undone."""

    name: ClassVar[str]
    undone: ClassVar[str] = "nothing was applied"

    def fields(
        self, spec: GPSpec, clusters: int = 1, points: int = 0, full_cov: bool = False
    ) -> dict[str, Field]:
        """The declared reply of one client."""
        raise InputError(f"no fixed reply for {self.name!r} tasks: the strategy declares it")

    def answer(
        self, strategy: Strategy, ops: ClientOps, task: Task, units: Units, transform: DataTransform
    ) -> dict[str, torch.Tensor]:
        """The reply tensors of the clients of ``ops``, one row per client. ``ops`` hold the data in
        the units of ``transform``, the run's; ``units`` are the clients' outcome
        ``(offsets, scales)`` under it (back to the data's units)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"TaskKind({self.name!r})"


class Hello(TaskKind):
    name = "hello"
    undone = "the clients were not registered"

    def fields(self, spec, clusters=1, points=0, full_cov=False):
        return dict(HELLO_FIELDS)

    def answer(self, strategy, ops, task, units, transform):
        return {
            "n": ops.sizes.to(torch.long),
            "n_test": torch.tensor([0 if c.X_test is None else c.X_test.shape[0] for c in ops.clients]),
            "d": torch.tensor([c.n_features for c in ops.clients], dtype=torch.long),
        }


class Summarise(TaskKind):
    name = "summarise"
    undone = "the data transforms were not learned"

    def fields(self, spec, clusters=1, points=0, full_cov=False):
        raise InputError("summarise replies depend on the data's width and the stage: use summary_fields")

    def answer(self, strategy, ops, task, units, transform):
        outputs = int(task.setting("outputs", 0))  # per output: the outputs' means travel as a tensor
        center = task.shared.tensors["center"] if outputs and "center" in task.shared.tensors else None
        return client_summaries(
            ops.clients,
            task.setting("stage", "mean"),
            task.setting("bounds", False),
            task.setting("center", 0.0) if center is None else center,
            task.setting("scales", False),
            task.setting("hide_discrete", False),
            task.setting("unit", 1.0),
            outputs,
        )


class Transform(TaskKind):
    """The run's data transform, sent once: a client holds its data in these units from now on
    (the engine does, as :meth:`~fedgp.engines.base.InProcessEngine.use_transform`); the reply is
    empty, its arrival the acknowledgement."""

    name = "transform"
    undone = "the clients do not hold their data in the run's units"

    def fields(self, spec, clusters=1, points=0, full_cov=False):
        return {}

    def answer(self, strategy, ops, task, units, transform):
        return {}


class Train(TaskKind):
    name = "train"
    undone = "the round was not applied"

    def answer(self, strategy, ops, task, units, transform):
        return strategy.local_update(ops, task)


class _Personal(TaskKind):
    """The kinds answered under the state a client conditions on (the strategy's choice)."""

    def answer(self, strategy, ops, task, units, transform):
        states, cluster = strategy.personal_state(ops, task)
        offset, scale = (u.to(torch.float64) for u in units)
        return self.answer_under(states, cluster, ops, task, offset, scale, transform)

    def answer_under(self, states, cluster, ops, task, offset, scale, transform) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @staticmethod
    def _with_clusters(fields: dict[str, Field], clusters: int) -> dict[str, Field]:
        if "cluster" in fields:
            fields["cluster"] = Field((), torch.long, bounds=(0, clusters - 1))
        return fields


class Personal(_Personal):
    name = "personal"

    def fields(self, spec, clusters=1, points=0, full_cov=False):
        return self._with_clusters(
            {**state_fields(spec, "state/"), "cluster": Field((), torch.long)}, clusters
        )

    def answer_under(self, states, cluster, ops, task, offset, scale, transform):
        return {**state_tensors(states, "state/"), "cluster": cluster}


class Evaluate(_Personal):
    name = "evaluate"
    undone = "this round's test metrics were not recorded (its training was applied)"

    def fields(self, spec, clusters=1, points=0, full_cov=False):
        # The spec's own metrics (EVALUATE_FIELDS' for a Gaussian likelihood), the size and the cluster.
        metrics = {name: Field() for name in spec.metric_names}
        fields = {**metrics, "n_test": EVALUATE_FIELDS["n_test"], "cluster": EVALUATE_FIELDS["cluster"]}
        return self._with_clusters(fields, clusters)

    def answer_under(self, states, cluster, ops, task, offset, scale, transform):
        targets = [c.y_test for c in ops.clients]
        if ops.spec.variational:
            out = ops.spec.test_metrics(ops.predict(states), targets, states)
        elif transform.per_output:  # each test row back by its output's map, then scored
            maps = [transform.row_maps(c.X_test) for c in ops.clients]
            back = [transform.untransform_rows(p, c.X_test) for p, c in zip(ops.predict(states), ops.clients)]
            out = prediction_metrics(back, [y * s + o for y, (o, s) in zip(targets, maps)])
        else:
            out = prediction_metrics(ops.predict(states), targets)
        if not transform.per_output:
            # In the original units (a non-Gaussian likelihood's targets are never transformed: scale 1).
            out = transform.untransform(out, offset, scale)
        out["n_test"] = torch.tensor([len(c.y_test) for c in ops.clients], dtype=torch.long)
        out["cluster"] = cluster.to(torch.long)
        return out


class Predict(_Personal):
    name = "predict"

    def fields(self, spec, clusters=1, points=0, full_cov=False):
        fields = {"mean": Field((points,)), "variance_f": Field((points,)), "variance_y": Field((points,))}
        if not spec.conjugate:  # mean is E[y]; the latent f's mean travels too
            fields["mean_f"] = Field((points,))
        if full_cov:
            fields["covariance_f"] = Field((points, points))
        return fields

    def answer_under(self, states, cluster, ops, task, offset, scale, transform):
        full_cov = bool(task.setting("full_cov", False))
        X = transform.inputs(task.tensor("X")).to(ops.spec.dtype)
        predictions = ops.predict(states, X, full_cov)
        out = {
            "mean": torch.stack([p.mean for p in predictions]),
            "variance_f": torch.stack([p.variance_f for p in predictions]),
            "variance_y": torch.stack([p.variance_y for p in predictions]),
        }
        if predictions and predictions[0].latent_mean is not None:  # a non-Gaussian likelihood's
            out["mean_f"] = torch.stack([p.latent_mean for p in predictions])
        if full_cov:
            out["covariance_f"] = torch.stack([p.covariance_f for p in predictions])
        if transform.per_output:  # each point by its output's map
            return transform.untransform_rows(out, task.tensor("X"))
        return transform.untransform(out, offset, scale)  # back in the original units


#: Every kind a client answers, by its name on the wire.
KINDS: dict[str, TaskKind] = {
    kind.name: kind
    for kind in (Hello(), Summarise(), Transform(), Train(), Evaluate(), Predict(), Personal())
}


def handle(
    strategy: Strategy,
    ops: ClientOps,
    task: Task,
    units: Units | None = None,
    transform: DataTransform | None = None,
) -> dict[str, torch.Tensor]:
    """Carry out ``task`` on the clients of ``ops``; the reply tensors, one row per client.

    ``ops`` work on the data in the units of ``transform``, the run's (:mod:`fedgp.transforms`;
    default: none); ``units`` are the clients' outcome ``(offsets, scales)`` under it, with which
    predictions and test metrics go back to the original units (default: the data's own)."""
    try:
        kind = KINDS[task.kind]
    except KeyError:
        raise InputError(f"unknown task kind {task.kind!r}") from None
    if units is None:
        units = (torch.zeros(len(ops.clients)), torch.ones(len(ops.clients)))
    return kind.answer(strategy, ops, task, units, DataTransform() if transform is None else transform)


def reply_fields(
    kind: str, spec: GPSpec, num_clusters: int, points: int = 0, full_cov: bool = False
) -> dict[str, Field]:
    """The declared reply of a task kind that is not a training round (``predict`` with
    ``full_cov``: the joint covariance of f at the ``points`` inputs too)."""
    if kind not in KINDS:
        raise InputError(f"unknown task kind {kind!r}")
    return KINDS[kind].fields(spec, num_clusters, points, full_cov)


def summary_fields(
    d: int, stage: str, bounds: bool = False, scales: bool = False, outputs: int = 0
) -> dict[str, Field]:
    """What a client replies to ``summarise`` (:mod:`fedgp.transforms`). Stage ``"mean"``: its count
    and Σy (summed), its own per-feature minimum and maximum when the server learns the input
    bounds (individual), and with ``scales`` the log of its targets' sd and its square (summed:
    how much the owners' scales differ, for ``"auto"``). Stage ``"spread"``: Σ(y − ȳ)² about the
    federation's mean ȳ (summed) — two passes, because Σy² − nȳ² would lose about
    2·log10(|ȳ|/sd) of float64's 16 digits to cancellation. With ``outputs`` T > 0 (a multi-output
    spec) the count and sums are per output, ``(T,)`` each."""
    each = (outputs,) if outputs else ()
    if stage == "spread":
        return {"y_sumsq": Field(each, torch.float64, summed=True)}
    fields = {
        "count": Field(each, torch.float64, summed=True),
        "y_sum": Field(each, torch.float64, summed=True),
    }
    if bounds:
        fields.update(x_min=Field((d,)), x_max=Field((d,)))
    if scales:
        summed = Field((), torch.float64, summed=True)
        fields.update(log_sd=summed, log_sd_sq=summed)
    return fields
