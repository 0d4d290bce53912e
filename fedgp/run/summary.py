"""The data transforms of a run, learned before round 1: the ``summarise`` exchange.

When the transforms need the federation's statistics (:mod:`fedgp.transforms`: the mean and sd of
all targets, the union of the input boxes, for ``"auto"`` how far apart the owners' scales are),
the server asks every client for its summary — summed counts and sums, its own box — and does the
arithmetic; otherwise nothing is sent. The exchange tolerates failing clients as a training round
does (``Faults(min_replies=...)``): the transforms are then the replying clients' statistics.

The summed count is also the one check the server has of the sizes clients claimed at ``hello``
(which weight FedAvg and size-proportional sampling): a client claiming 10⁶ points while holding
100 would otherwise take almost all the weight. When the count and the claims disagree,
:func:`check_claimed_sizes` names the clients that could explain it and the run falls back to
uniform weights. A client that lies consistently in both is not caught; robust aggregators
(:mod:`fedgp.aggregators`) ignore the weights altogether.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import torch

from fedgp.engines.base import Engine
from fedgp.engines.tasks import summary_fields
from fedgp.errors import RunWarning
from fedgp.messages import Record, RoundPlan
from fedgp.messages.roster import Roster
from fedgp.models.spec import GPSpec
from fedgp.run.exchange import exchange
from fedgp.transforms import DataTransform, Transforms, auto_outcome, learn, spread_unit

__all__ = ["Summary", "learn_transform", "check_claimed_sizes"]


@dataclass
class Summary:
    """What the ``summarise`` exchange learned besides the transform: the clients that replied to
    it (positions), their summed count of training points (``None`` when no count was asked), and
    the clients that failed it, with the reason."""

    replied: torch.Tensor
    count: float | None = None
    failures: dict[int, str] = field(default_factory=dict)


def learn_transform(
    engine: Engine,
    roster: Roster,
    transforms: Transforms,
    spec: GPSpec,
    min_contributors: int = 1,
    min_replies: int | float | None = None,
) -> tuple[DataTransform, Summary]:
    """The run's :class:`~fedgp.transforms.DataTransform` and its :class:`Summary`: ``transforms``
    resolved for ``spec``, with a ``summarise`` exchange with every client when they need the
    federation's statistics (summed over at least ``min_contributors`` of them). ``min_replies``
    (``Faults(min_replies=...)``; ``None``: every client) is the fewest that must answer."""
    outcome, inputs, note = transforms.resolve(spec)
    outputs = 0 if outcome is None else outcome.outputs  # a multi-output spec: per output
    # federated or each owner's own? (per output: federated)
    choose = transforms.outcome == "auto" and outcome is not None and not outputs
    d = int(roster.dims[0])
    with_bounds = inputs is not None and inputs.bounds is None
    everyone = torch.arange(len(roster.ids))
    if not (with_bounds or (outcome is not None and not outcome.local)):
        return replace(learn(outcome, inputs, None, None, d), note=note), Summary(everyone)
    failures: dict[int, str] = {}

    def ask(stage: str, settings: dict, tensors: dict | None = None):
        fields = summary_fields(d, stage, with_bounds, settings.get("scales", False), outputs)
        shared = Record(
            tensors or {}, {"stage": stage, **settings, **({"outputs": outputs} if outputs else {})}
        )
        plan = RoundPlan(everyone, torch.ones(len(everyone)), shared, Record(), fields)
        replies = exchange(
            engine,
            "summarise",
            0,
            plan,
            roster.ids,
            min_replies=len(everyone) if min_replies is None else min_replies,
            min_contributors=min_contributors,
        ).replies
        failures.update(replies.failures)
        return replies

    hide = with_bounds and inputs.hide_discrete
    first = ask(
        "mean", {"bounds": with_bounds, "scales": choose, **({"hide_discrete": True} if hide else {})}
    )
    sums = dict(first.sums)
    if choose:
        outcome, note = auto_outcome(sums, len(everyone))
    unit = 1.0
    if outputs:  # each output's mean, as a tensor (an output no one holds: 0)
        center = sums["y_sum"] / sums["count"].clamp_min(1.0)
        sums.update(ask("spread", {"unit": unit}, {"center": center}).sums)
    elif outcome is not None and not outcome.local:
        center = float(sums["y_sum"]) / float(sums["count"])
        unit = spread_unit(sums, len(first.participants))  # targets of 1e-200 keep their spread
        sums.update(ask("spread", {"center": center, "unit": unit}).sums)
    count = float(sums["count"].sum()) if "count" in sums else None
    summary = Summary(first.participants.clone(), count, failures)
    return replace(learn(outcome, inputs, sums, first.individual, d, unit), note=note), summary


def check_claimed_sizes(roster: Roster, summary: Summary) -> Roster:
    """``roster``, or, when the sizes its clients claimed disagree with the summed count of the
    clients that answered the summary, a roster whose claimed sizes are all the counted mean (so
    size-weighted rules weigh everyone equally), with a :class:`~fedgp.errors.RunWarning` naming
    the clients whose claims alone could explain the difference."""
    if summary.count is None or not len(summary.replied):
        return roster
    claimed = roster.sizes[summary.replied].to(torch.float64)
    excess = float(claimed.sum()) - summary.count
    if abs(excess) < 0.5:
        return roster
    if excess > 0:  # over-claimed: a client holding at least 2 points that claimed `excess` more
        suspects = summary.replied[claimed - excess >= 2]
    else:  # under-claimed by -excess: any replying client could hold the missing points
        suspects = summary.replied
    named = [roster.ids[int(p)] for p in suspects[:10]]
    more = f" (and {len(suspects) - 10} more)" if len(suspects) > 10 else ""
    warnings.warn(
        f"the clients claimed {int(claimed.sum())} training points at registration but their summary "
        f"counted {int(summary.count)}: clients whose claim alone could explain it: {named}{more}. "
        "Size-weighted rules (FedAvg weights, size-proportional sampling) use uniform weights for this "
        "run; a robust aggregator ignores the weights anyway",
        RunWarning,
        stacklevel=3,
    )
    mean = max(int(round(summary.count / len(summary.replied))), 2)
    return replace(roster, sizes=torch.full_like(roster.sizes, mean))
