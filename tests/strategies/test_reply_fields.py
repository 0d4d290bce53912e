"""``Strategy.reply_fields``: what a training round's reply declares, known before any round (client-
level DP judges a strategy by it, :func:`fedgp.run.privacy.refusal`), is what its rounds then declare."""

from __future__ import annotations

import pytest

from fedgp.rng import generator
from fedgp.run import Progress, Run
from fedgp.testing.zoo import strategy_zoo

ZOO = strategy_zoo()


@pytest.mark.filterwarnings("ignore::fedgp.errors.RunWarning")  # Phase 1's refills say what they did
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_training_round_declares_the_strategys_reply_fields(name):
    data, spec, strategy, rounds = ZOO[name]
    run = Run(spec, data.federation, strategy, rounds, engine="sequential", seed=11, transforms=None,
              callbacks=[Progress(False)]).start()  # fmt: skip
    declared = dict(strategy.reply_fields(run.context))
    training = 0
    while not run.done:
        rnd = run.completed
        plan = strategy.configure(rnd, run.server, run.context, generator(run.seed, "configure", rnd))
        if plan.shared.settings.get("phase") != "init":  # a clustered strategy's initialisation rounds
            assert dict(plan.replies) == declared, rnd
            training += 1
        run.round()
    assert training > 0
