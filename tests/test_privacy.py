"""Client-level differential privacy (``fit(spec, fed, ClientDP(FGPR(), ...))``): the accountant is the
library's, one client moves the noisy sum by at most C, the noise has the stated scale, the budget
stops a run, and what the analysis does not cover is refused."""

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import fedgp
from fedgp.aggregators import CoordinateMedian
from fedgp.data import Federation
from fedgp.errors import InputError, InputTypeError, PrivacyBudgetWarning
from fedgp.messages import Field, Replies, RoundPlan, ServerContext, Task
from fedgp.run import ClientDP, Progress
from fedgp.run.privacy import calibrate_noise, epsilon_spent, probe_context, refusal
from fedgp.strategies import (
    DPFGPR,
    FGPR,
    IFCA,
    ClusteredGP,
    FederatedClustering,
    MomentDescentInit,
    MomentumClustering,
    Strategy,
    WeightedFGPR,
)
from fedgp.strategies.private import UPDATE, clip_updates
from fedgp.transforms import Normalize, Standardize, Transforms

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting import rdp  # noqa: E402

QUIET = [Progress(False)]


@pytest.fixture(scope="module")
def draws():
    return fedgp.synthetic.gp_federation(num_clients=30, n=15, d=1, seed=3)


def library_epsilon(noise: float, rate: float, rounds: int, delta: float) -> float:
    """dp-accounting's own answer, composed round by round as its documentation does."""
    accountant = rdp.RdpAccountant()
    event = dp_accounting.GaussianDpEvent(noise)
    if rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(rate, event)
    for _ in range(rounds):
        accountant.compose(event)
    return accountant.get_epsilon(delta)


def test_the_historys_epsilon_is_the_librarys_own_accounting(draws):
    private = ClientDP(FGPR(), noise=1.3, rate=0.4, delta=1e-3, clip=0.5)
    result = fedgp.fit(draws.spec, draws.federation, private, rounds=5, callbacks=QUIET)
    spent = result.history["epsilon"].to_numpy()
    expected = [library_epsilon(1.3, 0.4, r, 1e-3) for r in range(1, 6)]
    np.testing.assert_allclose(spent, expected, rtol=1e-12)
    assert (np.diff(spent) > 0).all()
    assert result.history.attrs["privacy"]["epsilon"] == pytest.approx(expected[-1], rel=1e-12)
    # Poisson sampling: some rounds have fewer than all 30 clients, none is asked its size or loss.
    assert result.history["participants"].min() < 30


def test_the_calibrated_noise_spends_the_budget_in_the_planned_rounds(draws):
    result = fedgp.fit(draws.spec, draws.federation, ClientDP(epsilon=1.5, rate=0.3), rounds=8,
                       callbacks=QUIET)  # fmt: skip
    last = float(result.history["epsilon"].iloc[-1])
    assert len(result.history) == 8 and 1.5 * 0.995 <= last <= 1.5
    z = result.strategy.noise
    assert library_epsilon(z, 0.3, 8, 1e-5) <= 1.5 < library_epsilon(z * 0.99, 0.3, 8, 1e-5)
    assert calibrate_noise(1.5, 1e-5, 0.3, 8) == pytest.approx(z)


def test_a_spent_budget_stops_the_run_and_keeps_the_last_affordable_round(draws):
    z, q = 1.0, 0.5
    budget = (epsilon_spent(z, q, 3, 1e-5) + epsilon_spent(z, q, 4, 1e-5)) / 2  # affords 3 rounds
    common = dict(rounds=10, seed=4, callbacks=QUIET)
    with pytest.warns(PrivacyBudgetWarning, match="affords 3 of the 10 rounds"):
        private = ClientDP(FGPR(), budget, noise=z, rate=q, reproducible=True)
        stopped = fedgp.fit(draws.spec, draws.federation, private, **common)
    assert len(stopped.history) == 3 and "privacy budget" in stopped.history.attrs["stop_reason"]
    three = fedgp.fit(draws.spec, draws.federation, ClientDP(FGPR(), noise=z, rate=q, reproducible=True),
                      **{**common, "rounds": 3})  # fmt: skip
    assert stopped.state.allclose(three.state, rtol=1e-12)


def test_one_client_moves_the_sum_by_at_most_clip(draws):
    """The sensitivity the accountant assumes: federations that differ by one client (here an
    outlier with targets of scale 1e4) give noiseless sums within C of each other."""
    clients = list(draws.federation)
    outlier = fedgp.data.ClientData(clients[0].X, clients[0].y * 1e4, id="outlier")
    clip = 0.05
    fedavg = FGPR(server_optimizer=None, lr=1.0)

    def summed_update(federation):
        private = ClientDP(fedavg, noise=0.0, clip=clip, delta=1e-3)
        result = fedgp.fit(draws.spec, federation, private, rounds=1, callbacks=QUIET)
        start, end = draws.spec.to_raw(draws.spec.initial_state()), draws.spec.to_raw(result.state)
        return torch.cat([(end[k] - start[k]).reshape(-1) for k in start]) * len(federation)

    without = summed_update(Federation(clients))
    with_outlier = summed_update(Federation([*clients, outlier]))
    moved = float((with_outlier - without).norm())
    assert moved <= clip * (1 + 1e-9)
    assert moved > 0.5 * clip  # the outlier's update was large and clipped, not dropped


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=6), st.floats(1e-3, 10.0))
@example(values=[1.3701448956127729], clip=1.3701448956127729)  # norm == clip: found by make test-random
def test_clipping_bounds_every_update_and_keeps_its_direction(values, clip):
    delta = fedgp.models.state.HyperState(
        {"a": torch.tensor([values], dtype=torch.float64)}, {"a": (len(values),)}
    )
    clipped, norms = clip_updates(delta, clip)
    out = clipped["a"][0]
    assert float(out.norm()) <= clip * (1 + 1e-12)
    if float(norms[0]) <= clip:
        assert torch.equal(out, delta["a"][0])
    else:
        torch.testing.assert_close(out / out.norm(), delta["a"][0] / delta["a"][0].norm())


def test_the_server_noise_has_standard_deviation_noise_times_clip_over_the_expected_count(draws):
    spec = draws.spec
    strategy = DPFGPR(FGPR(server_optimizer=None), clip=0.2, noise=1.5, rate=0.25, reproducible=True)
    k = 40
    ctx = ServerContext(
        spec, torch.ones(k, dtype=torch.long), torch.full((k,), 1 / k), list(range(k)), seed=0
    )
    theta = spec.initial_state()
    nothing = Replies(
        torch.zeros(0, dtype=torch.long), torch.zeros(0), {}, {}, {}, torch.zeros(0, dtype=torch.long)
    )
    steps = []
    for rnd in range(400):
        new, _ = strategy.aggregate(rnd, theta, None, nothing, ctx)
        raw, start = spec.to_raw(new), spec.to_raw(theta)
        steps.append(torch.cat([(raw[k] - start[k]).reshape(-1) for k in spec.trainable_names]))
    steps = torch.stack(steps)
    expected = 1.5 * 0.2 / (0.25 * k)
    assert float(steps.std()) == pytest.approx(expected, rel=0.06)
    assert abs(float(steps.mean())) < 4 * expected / math.sqrt(steps.numel())
    # Not reproducible: the noise comes from the operating system, different every time.
    secret = DPFGPR(FGPR(server_optimizer=None), clip=0.2, noise=1.5, rate=0.25)
    a, _ = secret.aggregate(0, theta, None, nothing, ctx)
    b, _ = secret.aggregate(0, theta, None, nothing, ctx)
    assert not a.allclose(b, rtol=0, atol=0)


def test_engines_agree_on_a_private_run(draws):
    private = ClientDP(FGPR(), noise=0.8, rate=0.5, reproducible=True)
    runs = {
        engine: fedgp.fit(draws.spec, draws.federation, private, rounds=4, engine=engine, callbacks=QUIET)
        for engine in ("sequential", "batched")
    }
    assert runs["sequential"].state.allclose(runs["batched"].state, rtol=1e-8)
    np.testing.assert_array_equal(
        runs["sequential"].history["participants"], runs["batched"].history["participants"]
    )


def test_nothing_but_the_sum_leaves_a_client(draws):
    """Every training reply field is summed; no summarise exchange (the transforms send nothing)."""
    seen = []

    class Watch(fedgp.run.Callback):
        def on_round(self, run, row):
            plan = run.strategy.configure(run.completed, run.server, run.context, np.random.default_rng(0))
            seen.append({name: field.summed for name, field in plan.replies.items()})

    result = fedgp.fit(
        draws.spec, draws.federation, ClientDP(noise=1.0), rounds=2, callbacks=[*QUIET, Watch()]
    )
    assert seen and all(all(s.values()) and all(n.startswith(UPDATE) for n in s) for s in seen)
    assert result.history.attrs["transforms"]["outcome"].startswith("standardize, each client's own")
    assert "test_rmse_mean" not in result.history  # per-client test metrics only when asked


@pytest.mark.parametrize(
    "strategy, match",
    [
        (IFCA(num_clusters=2), "to IFCA: its training reply declares the individual fields 'choice', 'nll'"),
        (IFCA(aggregation="gradient"), "to IFCA: its training reply declares the individual fields 'choice'"),
        (ClusteredGP(2, MomentDescentInit()), "to ClusteredGP: its training reply declares the individual"),
        (FederatedClustering(), "to FederatedClustering: .* individual fields 'grad/"),
        (MomentumClustering(), "to MomentumClustering: .* individual fields 'momentum/"),
        (DPFGPR(FGPR(), clip=1.0, noise=1.0), "to DPFGPR: it is not an FGPR.*its summed fields 'update/"),
        (WeightedFGPR(hf_weight=0.5), "to WeightedFGPR: it overrides FGPR's configure, which DPFGPR"),
        (FGPR(aggregator=CoordinateMedian()), "to FGPR\\(aggregator=.*a robust rule looks at each client's"),
        (FGPR.authors(), "the default mean in raw space"),
        (FGPR(clients_per_round=5), "ClientDP\\(rate=...\\)"),
    ],
)
def test_what_the_analysis_does_not_cover_is_refused(draws, strategy, match):
    with pytest.raises(InputError, match=match):
        fedgp.fit(draws.spec, draws.federation, ClientDP(strategy, noise=1.0), rounds=2, callbacks=QUIET)


@dataclass(frozen=True)
class Replying(Strategy):
    """A user's strategy that declares ``fields`` for its training rounds (its client and server
    sides are never reached: ClientDP judges it before any round)."""

    fields: tuple = ()

    def initialize(self, ctx, rng):
        return ctx.spec.initial_state()

    def configure(self, rnd, server, ctx, rng):
        return RoundPlan(torch.arange(ctx.num_clients), ctx.weights, replies=dict(self.fields))

    def aggregate(self, rnd, server, plan, replies, ctx):
        raise NotImplementedError

    def configure_personal(self, server, ctx, positions):
        raise NotImplementedError

    def global_state(self, server):
        return server

    def local_update(self, ops, task):
        raise NotImplementedError

    def personal_state(self, ops, task):
        raise NotImplementedError


def test_a_users_strategy_is_judged_by_its_declared_reply_fields(draws):
    """No table of names: an individual field in a training reply is refused by its name; a reply of
    summed fields only passes that check, and is refused for the reason that remains — DPFGPR clips
    FGPR's update, and nothing bounds one client's share of a plain sum."""
    ctx = probe_context(draws.spec)
    individual = Replying((("stats", Field((2,), summed=True)), ("label", Field((), torch.long))))
    assert refusal(individual, ctx).startswith(
        "ClientDP does not apply to Replying: its training reply declares the individual field 'label', "
        "which the noise on the sum does not cover"
    )
    summed = Replying((("stats", Field((2,), summed=True)), ("count", Field((), summed=True))))
    why = refusal(summed, ctx)
    assert (
        why.startswith("ClientDP does not apply to Replying: it is not an FGPR") and "individual" not in why
    )
    assert "its summed fields 'stats', 'count' bound no client's share" in why
    with pytest.raises(InputError, match="ClientDP does not apply to Replying: .* 'label'"):
        fedgp.fit(draws.spec, draws.federation, ClientDP(individual, noise=1.0), rounds=1, callbacks=QUIET)
    # FGPR itself, and a subclass that only adds settings, pass every check.
    assert refusal(FGPR(), ctx) is None and refusal(Quieter(), ctx) is None
    with pytest.raises(InputTypeError, match="ClientDP's first argument is the strategy"):
        ClientDP(2.0)


@dataclass(frozen=True)
class Quieter(FGPR):
    """A subclass of FGPR that changes a default and nothing else."""

    lr: float = 0.1


@pytest.mark.parametrize(
    "transforms, match",
    [
        (Transforms(Standardize(), None), "Standardize\\(\\) sends each client's count"),
        (Transforms(None, Normalize()), "Normalize\\(\\) sends each client's input box"),
    ],
)
def test_transforms_that_need_the_federations_statistics_are_refused(draws, transforms, match):
    with pytest.raises(InputError, match=match):
        fedgp.fit(draws.spec, draws.federation, ClientDP(noise=1.0), rounds=1, transforms=transforms)


def test_known_bounds_are_allowed_and_delta_must_be_below_one_over_k(draws):
    bounds = Transforms(None, Normalize(bounds=[[0.0], [1.0]]))
    result = fedgp.fit(draws.spec, draws.federation, ClientDP(noise=1.0), rounds=1, transforms=bounds,
                       callbacks=QUIET)  # fmt: skip
    assert result.history.attrs["transforms"]["inputs"].startswith(
        "normalize to the unit cube from lower [0]"
    )
    with pytest.raises(InputError, match="below 1/K = 0.0333"):
        fedgp.fit(draws.spec, draws.federation, ClientDP(noise=1.0, delta=0.05), rounds=1, callbacks=QUIET)


@given(
    epsilon=st.one_of(st.none(), st.floats(allow_nan=True)),
    delta=st.floats(allow_nan=True),
    clip=st.floats(allow_nan=True),
    noise=st.one_of(st.none(), st.floats(allow_nan=True)),
    rate=st.floats(allow_nan=True),
)
def test_clientdp_takes_valid_settings_or_says_which_is_wrong(epsilon, delta, clip, noise, rate):
    try:
        privacy = ClientDP(FGPR(), epsilon, delta, clip, noise, rate)
    except InputError as err:
        assert "ClientDP" in str(err)
        return
    assert (privacy.epsilon or 1) > 0 and 0 < privacy.delta < 1 and privacy.clip > 0 and 0 < privacy.rate <= 1


@given(noise=st.floats(0.3, 20.0), rate=st.floats(1e-3, 1.0), rounds=st.integers(1, 500))
def test_more_rounds_cost_more_and_more_noise_costs_less(noise, rate, rounds):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        now = epsilon_spent(noise, rate, rounds, 1e-5)
        assert epsilon_spent(noise, rate, rounds + 1, 1e-5) >= now
        assert epsilon_spent(noise * 1.5, rate, rounds, 1e-5) <= now


def test_a_private_run_on_flower_is_the_in_process_run(draws):
    """The DP strategy crosses Flower's wire format as JSON and its updates come back as sums."""
    pytest.importorskip("flwr")
    from fedgp.flower import Flower

    private = ClientDP(FGPR(), noise=0.8, rate=0.5, reproducible=True)
    flower = fedgp.fit(draws.spec, draws.federation, private, rounds=3, engine=Flower(num_nodes=3),
                       callbacks=QUIET)  # fmt: skip
    local = fedgp.fit(draws.spec, draws.federation, private, rounds=3, engine="sequential", callbacks=QUIET)
    assert flower.state.allclose(local.state, rtol=1e-10)


def test_the_flower_apps_privacy_setting_is_clientdp():
    pytest.importorskip("flwr")
    from fedgp.flower.app import AppSettings

    privacy = AppSettings({"privacy": '{"epsilon": 4, "rate": 0.5, "clip": 0.2}', "lr": 0.1}).privacy()
    assert privacy == ClientDP(FGPR(lr=0.1), epsilon=4, rate=0.5, clip=0.2)  # the app's strategy, wrapped
    assert AppSettings({}).privacy() is None
    for bad in ('{"epsilon": -1}', "[4]", '{"epsilon": 4, "colour": 1}', "{"):
        with pytest.raises(InputError, match="run config 'privacy'"):
            AppSettings({"privacy": bad}).privacy()


def test_a_round_that_samples_no_one_still_takes_its_noisy_step(draws):
    """Poisson sampling may draw nobody; DP-FedAvg then releases noise alone, on every engine."""
    few = Federation(list(draws.federation)[:5])
    private = ClientDP(FGPR(), noise=1.0, rate=0.01, delta=1e-3, reproducible=True)
    runs = [
        fedgp.fit(draws.spec, few, private, rounds=2, engine=e, callbacks=QUIET)
        for e in ("sequential", "batched")
    ]
    assert all((r.history["participants"] == 0).all() for r in runs)
    assert not runs[0].state.allclose(draws.spec.initial_state(), rtol=1e-6)
    assert runs[0].state.allclose(runs[1].state, rtol=1e-12)


def test_distributed_noise_makes_the_full_noise_from_the_clients_shares(draws):
    """noise_at="clients": each reply carries N(0, (zC)²/t) on every trainable coordinate, so a sum of
    t replies has the full noise and the server adds none; below t it tops up the difference."""
    spec, k, t = draws.spec, 8, 4
    strategy = DPFGPR(FGPR(server_optimizer=None), clip=0.2, noise=1.5, rate=1.0, reproducible=True,
                      noise_at="clients", noise_shares=t)  # fmt: skip
    engine = fedgp.engines.Sequential().build(spec, list(draws.federation)[:k])
    engine.start(strategy, 0)
    ctx = ServerContext(
        spec, torch.ones(k, dtype=torch.long), torch.full((k,), 1 / k), list(range(k)), seed=0
    )
    theta = spec.initial_state()
    # The clients' replies: their clipped updates plus their shares of the noise.
    shares = []
    for rnd in range(60):
        plan = strategy.configure(rnd, theta, ctx, np.random.default_rng(rnd))
        out = engine.run(Task("train", rnd, plan.shared, plan.personal, {}), plan.participants, plan.replies)
        clean = replace(strategy, noise_at="server", noise_shares=1)
        engine.start(clean, 0)
        exact = engine.run(
            Task("train", rnd, plan.shared, plan.personal, {}), plan.participants, plan.replies
        )
        engine.start(strategy, 0)
        shares.append(torch.cat([(out.sums[n] - exact.sums[n]).reshape(-1) for n in out.sums
                                 if n.removeprefix(UPDATE) in spec.trainable_names]))  # fmt: skip
    shares = torch.stack(shares)  # the sum of k shares per coordinate
    assert float(shares.std()) == pytest.approx(1.5 * 0.2 * math.sqrt(k / t), rel=0.1)
    # The server adds nothing with t or more contributions, and the missing variance with fewer.
    for replied, topup in ((k, 0.0), (t, 0.0), (1, 0.75)):
        replies = Replies(torch.arange(replied), torch.ones(replied), {}, {}, {}, torch.arange(replied))
        steps = []
        for rnd in range(300 if topup else 3):
            new, metrics = strategy.aggregate(rnd, theta, None, replies, ctx)
            assert metrics == {"noise_topup": topup}
            raw, start = spec.to_raw(new), spec.to_raw(theta)
            steps.append(torch.cat([(raw[n] - start[n]).reshape(-1) for n in spec.trainable_names]))
        steps = torch.stack(steps)
        expected = math.sqrt(topup) * 1.5 * 0.2 / k
        assert (
            float(steps.std()) == pytest.approx(expected, rel=0.08)
            if topup
            else float(steps.abs().max()) == 0
        )


def test_distributed_noise_is_a_run_option_the_engines_agree_on(draws):
    private = ClientDP(FGPR(), noise=0.8, rate=0.5, reproducible=True, noise_at="clients", noise_shares=3)
    runs = {engine: fedgp.fit(draws.spec, draws.federation, private, rounds=3, engine=engine,
                              callbacks=QUIET) for engine in ("sequential", "batched")}  # fmt: skip
    assert runs["sequential"].state.allclose(runs["batched"].state, rtol=1e-8)
    assert (
        "noise_topup" in runs["batched"].history
        and runs["batched"].history.attrs["privacy"]["noise_at"] == "clients"
    )
    with pytest.raises(InputError, match="needs noise_shares"):
        ClientDP(noise=1.0, noise_at="clients")
    with pytest.raises(InputError, match="only with noise_at='clients'"):
        ClientDP(noise=1.0, noise_shares=3)
    with pytest.raises(InputError, match="'server' or 'clients'"):
        ClientDP(noise=1.0, noise_at="everywhere")


@pytest.fixture(scope="module")
def six():
    return fedgp.synthetic.gp_federation(num_clients=6, n=10, d=1, seed=0)


def test_a_budget_that_affords_no_round_refuses_before_any_client_trains(six):
    """Issue 51: ClientDP(epsilon=0.5, noise=0.3) spent ε = 20.39 in its first round. It is refused
    before the first round, naming the smallest noise multiplier that fits one round (dp-accounting's
    calibration); that noise then runs, within the budget."""
    trained = []

    class Watch(fedgp.run.Callback):
        def on_round(self, run, row):
            trained.append(row["round"])

    with pytest.raises(InputError, match="affords 0 of the 10 rounds at noise 0.3") as refused:
        fedgp.fit(six.spec, six.federation, ClientDP(FGPR(), epsilon=0.5, noise=0.3), rounds=10,
                  callbacks=[*QUIET, Watch()])  # fmt: skip
    assert not trained
    message = str(refused.value)
    assert "already spends ε = 20.39" in message
    suggested = float(message.split("fits one round is noise=")[1].split()[0])
    assert suggested == pytest.approx(calibrate_noise(0.5, 1e-5, 1.0, 1), rel=2e-3)
    assert epsilon_spent(suggested, 1.0, 1, 1e-5) <= 0.5 < epsilon_spent(suggested * 0.99, 1.0, 1, 1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyBudgetWarning)
        result = fedgp.fit(six.spec, six.federation, ClientDP(FGPR(), epsilon=0.5, noise=suggested),
                           rounds=10, callbacks=QUIET)  # fmt: skip
    assert len(result.history) >= 1 and (result.history["epsilon"] <= 0.5).all()
    # Refused where the run is made, too: Run(...) raises before any engine starts.
    with pytest.raises(InputError, match="fits one round is noise="):
        fedgp.run.Run(six.spec, six.federation, ClientDP(FGPR(), epsilon=0.5, noise=0.3, rate=0.5,
                                                         delta=1e-3), rounds=3)  # fmt: skip


@pytest.mark.parametrize(
    "epsilon, noise, rate, rounds",
    [
        (0.5, 0.3, 1.0, 10),
        (1.0, 0.8, 0.5, 5),
        (0.2, 5.0, 0.5, 3),
        (3.0, 2.0, 1.0, 4),
        (5.0, 1.5, 1.0, 6),
        (2.0, 2.0, 0.5, 5),
        (4.0, 3.0, 1.0, 4),
    ],  # fmt: skip
)
def test_no_run_records_epsilon_above_its_budget(six, epsilon, noise, rate, rounds):
    """Every row's ε is within the budget: the run stops after the last round it affords, or is
    refused before the first."""
    private = ClientDP(FGPR(), epsilon=epsilon, noise=noise, rate=rate, delta=1e-3, reproducible=True)
    affords = sum(epsilon_spent(noise, rate, r, 1e-3) <= epsilon for r in range(1, rounds + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyBudgetWarning)
        try:
            result = fedgp.fit(six.spec, six.federation, private, rounds=rounds, callbacks=QUIET)
        except InputError as err:
            assert affords == 0 and "affords 0 of the" in str(err)
            return
    assert len(result.history) == affords >= 1
    assert (result.history["epsilon"] <= epsilon).all()
    assert result.history.attrs["privacy"]["epsilon"] <= epsilon


def test_a_run_resumed_from_a_budget_stopped_checkpoint_takes_no_further_round(six, tmp_path):
    """The checkpoint of a run the budget stopped holds its rounds, not why it stopped: resumed, the
    run stops again before the round the budget does not afford."""
    z = 2.0
    budget = (epsilon_spent(z, 1.0, 2, 1e-3) + epsilon_spent(z, 1.0, 3, 1e-3)) / 2  # affords 2 rounds
    private = ClientDP(FGPR(), epsilon=budget, noise=z, delta=1e-3, reproducible=True)
    path = tmp_path / "run.ckpt"
    with pytest.warns(PrivacyBudgetWarning, match="affords 2 of the 5 rounds"):
        first = fedgp.fit(six.spec, six.federation, private, rounds=5,
                          callbacks=[*QUIET, fedgp.run.Checkpointing(path)])  # fmt: skip
    with pytest.warns(PrivacyBudgetWarning, match="affords 2 of the 5 rounds"):
        resumed = fedgp.fit(six.spec, six.federation, private, rounds=5,
                            callbacks=[*QUIET, fedgp.run.Checkpointing(path, resume=True)])  # fmt: skip
    assert len(first.history) == len(resumed.history) == 2
    assert (resumed.history["epsilon"] <= budget).all()
    assert resumed.state.allclose(first.state, rtol=1e-12)
