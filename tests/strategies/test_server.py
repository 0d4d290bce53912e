"""Server optimisers (FedAvgM, FedAdam, FedYogi) against their published update rules, and the
local step-size schedules; both run the same on every engine and survive a checkpoint."""

import numpy as np
import pytest
import torch

import fedgp
from fedgp.models import GPSpec
from fedgp.run import Checkpointing, Evaluate, Progress
from fedgp.strategies import (
    FGPR,
    SGD,
    CosineDecay,
    FedAdam,
    FedAvgM,
    FedYogi,
    InverseRound,
    ServerState,
    StepDecay,
)
from fedgp.synthetic import gp_federation
from fedgp.testing.strategy import StrategyContract

QUIET = [Evaluate(every=0), Progress(False)]


def _reference(rule: str, x0: np.ndarray, averages: list[np.ndarray], lr, b1, b2, tau):
    """Reddi et al. (2021), Algorithm 2, and Hsu et al. (2019), written out in numpy."""
    x, m, v = x0.copy(), np.zeros_like(x0), np.full_like(x0, tau**2)
    for avg in averages:
        delta = avg - x
        if rule == "avgm":
            m = b1 * m + delta
            x = x + lr * m
            continue
        m = b1 * m + (1 - b1) * delta
        v = (
            b2 * v + (1 - b2) * delta**2
            if rule == "adam"
            else v - (1 - b2) * delta**2 * np.sign(v - delta**2)
        )
        x = x + lr * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize(
    "rule, optimizer",
    [
        ("avgm", FedAvgM(lr=0.7, momentum=0.8)),
        ("adam", FedAdam(lr=0.3, betas=(0.85, 0.97), tau=1e-2)),
        ("yogi", FedYogi(lr=0.3, betas=(0.85, 0.97), tau=1e-2)),
    ],
)
def test_server_steps_follow_the_published_rule(rule, optimizer):
    spec = GPSpec()
    rng = np.random.default_rng(0)
    x0 = spec.to_raw(spec.initial_state())
    names = list(x0)
    averages_raw = [
        {k: x0[k] + torch.as_tensor(rng.normal(0, 0.5, x0[k].shape)) for k in names} for _ in range(4)
    ]
    server = optimizer.start(spec.initial_state())
    for avg in averages_raw:
        server = optimizer.step(spec, server, spec.from_raw(fedgp.models.HyperState(avg, spec.event_shapes)))
    assert isinstance(server, ServerState) and server.steps == 4
    flat = lambda state: np.concatenate([state[k].numpy().ravel() for k in names])  # noqa: E731
    b1 = optimizer.momentum if rule == "avgm" else optimizer.betas[0]
    b2, tau = (0.0, 0.0) if rule == "avgm" else (optimizer.betas[1], optimizer.tau)
    expected = _reference(rule, flat(x0), [flat(a) for a in averages_raw], optimizer.lr, b1, b2, tau)
    np.testing.assert_allclose(flat(spec.to_raw(server.theta)), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("optimizer", [FedAvgM(lr=0.7, momentum=0.8), FedAdam(lr=0.3), FedYogi(lr=0.3)])
def test_a_variational_specs_inducing_locations_take_the_plain_average(optimizer):
    """Z is the clients' average after every step; the hyper-parameters still follow the rule (they
    move by the rule's step, not to the average)."""
    spec = fedgp.VariationalGPSpec(6, input_dim=2)
    assert spec.server_averaged == {"variational_strategy.inducing_points"} and not GPSpec().server_averaged
    rng = np.random.default_rng(1)
    x0 = spec.to_raw(spec.initial_state())
    server = optimizer.start(spec.initial_state())
    for _ in range(3):
        avg = {k: v + torch.as_tensor(rng.normal(0, 0.5, v.shape)) for k, v in x0.items()}
        server = optimizer.step(spec, server, spec.from_raw(fedgp.models.HyperState(avg, spec.event_shapes)))
        raw = spec.to_raw(server.theta)
        for name in raw:
            if name in spec.server_averaged:
                torch.testing.assert_close(raw[name], avg[name], rtol=0, atol=0)
            else:
                assert not torch.allclose(raw[name], avg[name])


def test_fedavgm_without_momentum_at_rate_one_is_fedavg():
    draws = gp_federation(num_clients=4, n=20, d=1, seed=1)
    plain = fedgp.fit(draws.spec, draws.federation, FGPR(server_optimizer=None), rounds=4, callbacks=QUIET)
    opt = FGPR(server_optimizer=FedAvgM(lr=1.0, momentum=0.0))
    stepped = fedgp.fit(draws.spec, draws.federation, opt, rounds=4, callbacks=QUIET)
    for name in plain.state:
        torch.testing.assert_close(stepped.state[name], plain.state[name], rtol=1e-12, atol=1e-12)


def test_schedules_scale_each_rounds_local_rate():
    assert [InverseRound(10)(r) for r in (0, 10, 30)] == [1.0, 0.5, 0.25]
    assert CosineDecay(100, 0.1)(0) == 1.0 and CosineDecay(100, 0.1)(100) == pytest.approx(0.1)
    assert CosineDecay(100)(50) == pytest.approx(0.5) and CosineDecay(100, 0.1)(500) == pytest.approx(0.1)
    assert [StepDecay(25, 0.5)(r) for r in (0, 24, 25, 60)] == [1.0, 1.0, 0.5, 0.25]
    strategy = FGPR(lr=0.08, lr_schedule=StepDecay(2, 0.5))
    assert [strategy.local_training(r).optimizer.lr for r in range(5)] == [0.08, 0.08, 0.04, 0.04, 0.02]
    constant = FGPR(lr=0.08)
    assert constant.local_training(7) is constant.local  # no schedule: the same local training
    with pytest.raises(fedgp.InputTypeError, match="server_optimizer must be"):
        FGPR(server_optimizer="adam")
    with pytest.raises(fedgp.InputError, match="momentum"):
        FedAvgM(momentum=1.0)


def test_a_schedule_changes_the_run_only_from_the_round_it_decays():
    draws = gp_federation(num_clients=3, n=20, d=1, seed=2)
    plain = fedgp.fit(draws.spec, draws.federation, FGPR.authors(), rounds=4, callbacks=QUIET)
    decayed = fedgp.fit(
        draws.spec, draws.federation, FGPR.authors(lr_schedule=StepDecay(3, 0.1)), rounds=4, callbacks=QUIET
    )
    nll = plain.history["train_nll"].tolist(), decayed.history["train_nll"].tolist()
    assert nll[0][:3] == nll[1][:3] and nll[0][3] != nll[1][3]


SERVER_STRATEGY = FGPR(
    optimizer=SGD(lr=0.2, schedule="constant"), server_optimizer=FedYogi(lr=0.05), lr_schedule=InverseRound(5)
)


@pytest.mark.parametrize("engine", ["batched"])
def test_server_optimiser_and_schedule_agree_across_engines(engine):
    draws = gp_federation(num_clients=5, n=[12, 20, 30, 8, 40], d=2, seed=3)
    runs = [
        fedgp.fit(draws.spec, draws.federation, SERVER_STRATEGY, rounds=5, engine=e, callbacks=QUIET)
        for e in ("sequential", engine)
    ]
    for name in runs[0].state:
        torch.testing.assert_close(runs[1].state[name], runs[0].state[name], rtol=1e-8, atol=1e-10)


def test_a_resumed_run_keeps_the_server_moments(tmp_path):
    draws = gp_federation(num_clients=3, n=20, d=1, seed=4)
    unbroken = fedgp.fit(draws.spec, draws.federation, SERVER_STRATEGY, rounds=6, callbacks=QUIET)
    path = tmp_path / "run.ckpt"
    fedgp.fit(
        draws.spec, draws.federation, SERVER_STRATEGY, rounds=3, callbacks=[*QUIET, Checkpointing(path)]
    )
    resumed = fedgp.fit(
        draws.spec,
        draws.federation,
        SERVER_STRATEGY,
        rounds=6,
        callbacks=[*QUIET, Checkpointing(path, resume=True)],
    )
    for name in unbroken.state:
        assert torch.equal(resumed.state[name], unbroken.state[name])


class TestFGPRServerOptimiserContract(StrategyContract):
    strategy = SERVER_STRATEGY
    expected_replies = {"state/*": "individual", "loss": "individual"}
