"""The data transforms of a run, learned before round 1: the ``summarise`` exchange.

When the transforms need the federation's statistics (:mod:`fedgp.transforms`: the mean and sd of
all targets, the union of the input boxes, for ``"auto"`` how far apart the owners' scales are),
the server asks every client for its summary — summed counts and sums, its own box — and does the
arithmetic; otherwise nothing is sent.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fedgp.engines.base import Engine
from fedgp.messages import Record, RoundPlan, summary_fields
from fedgp.messages.roster import Roster
from fedgp.models.spec import GPSpec
from fedgp.run.exchange import exchange
from fedgp.transforms import DataTransform, Transforms, auto_outcome, learn

__all__ = ["learn_transform"]


def learn_transform(
    engine: Engine, roster: Roster, transforms: Transforms, spec: GPSpec, min_contributors: int = 1
) -> DataTransform:
    """The run's :class:`~fedgp.transforms.DataTransform`: ``transforms`` resolved for ``spec``, with
    a ``summarise`` exchange with every client when they need the federation's statistics (summed
    over at least ``min_contributors`` of them)."""
    outcome, inputs, note = transforms.resolve(spec)
    choose = transforms.outcome == "auto" and outcome is not None  # federated or each owner's own?
    d = int(roster.dims[0])
    with_bounds = inputs is not None and inputs.bounds is None
    if not (with_bounds or (outcome is not None and not outcome.local)):
        return replace(learn(outcome, inputs, None, None, d), note=note)
    everyone = torch.arange(len(roster.ids))

    def ask(stage: str, settings: dict):
        fields = summary_fields(d, stage, with_bounds, settings.get("scales", False))
        plan = RoundPlan(
            everyone, torch.ones(len(everyone)), Record({}, {"stage": stage, **settings}), Record(), fields
        )
        # Every client must answer: the transform is the whole federation's.
        return exchange(
            engine,
            "summarise",
            0,
            plan,
            roster.ids,
            min_replies=len(everyone),
            min_contributors=min_contributors,
        ).replies

    hide = with_bounds and inputs.hide_discrete
    first = ask(
        "mean", {"bounds": with_bounds, "scales": choose, **({"hide_discrete": True} if hide else {})}
    )
    sums = dict(first.sums)
    if choose:
        outcome, note = auto_outcome(sums, len(everyone))
    if outcome is not None and not outcome.local:
        center = float(sums["y_sum"]) / float(sums["count"])
        sums.update(ask("spread", {"center": center}).sums)
    return replace(learn(outcome, inputs, sums, first.individual, d), note=note)
