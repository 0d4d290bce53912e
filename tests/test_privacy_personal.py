"""Client-level DP with personal hyper-parameters (issue 52, item 2): ``ClientDP(FGPR(personal=...))``
clips and noises the shared hyper-parameters' update only; each owner trains and keeps its personal
ones as under FGPR, and they are in no reply. The accountant is unchanged."""

import math
from dataclasses import replace

import gpytorch
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.engines import Sequential
from fedgp.errors import InputError
from fedgp.messages import Replies, ServerContext, Task
from fedgp.run import ClientDP, Progress
from fedgp.run.privacy import probe_context
from fedgp.strategies import DPFGPR, FGPR
from fedgp.strategies.private import UPDATE

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting import rdp  # noqa: E402

QUIET = [Progress(False)]
NOISE, OUTPUTSCALE = "likelihood.noise_covar.noise", "covar_module.outputscale"
PERSONAL = ("noise", "outputscale")


@pytest.fixture(scope="module")
def equal():
    """Owners of equal sizes (DP-FedAvg's fixed weight 1/(qK) is then FGPR's p_k), noise levels 10x apart."""
    draws = fedgp.synthetic.gp_federation(num_clients=6, n=12, d=2, seed=5)
    clients = [
        fedgp.data.ClientData(c.X, c.y + (0.5 if k % 2 else 0.05) * torch.randn(len(c.y), dtype=torch.float64,
                              generator=torch.Generator().manual_seed(k)), id=c.id)
        for k, c in enumerate(draws.federation)
    ]  # fmt: skip
    return draws.spec, fedgp.data.Federation(clients)


def _fit(spec, federation, strategy, rounds=4, engine="sequential", callbacks=()):
    return fedgp.fit(spec, federation, strategy, rounds=rounds, engine=engine, seed=2, transforms=None,
                     callbacks=[*QUIET, *callbacks])  # fmt: skip


@pytest.mark.parametrize("where", [{}, {"noise_at": "clients", "noise_shares": 3}])
def test_without_noise_and_within_the_clip_it_is_fgpr_with_personal_values(equal, where):
    """noise = 0 and a clip no update reaches: every round's shared state and every owner's own
    values are FGPR(personal=...)'s to 1e-10. Before, ClientDP refused personal hyper-parameters."""
    spec, fed = equal
    inner = FGPR(local_steps=3, batch_size=8, personal=PERSONAL)
    plain = _fit(spec, fed, inner)
    private = _fit(spec, fed, ClientDP(inner, noise=0.0, clip=1e6, delta=1e-3, **where))
    columns = [c for c in plain.history if c in plain.state]
    np.testing.assert_allclose(private.history[columns], plain.history[columns], rtol=1e-10, atol=0)
    for k in range(len(fed)):
        for name, value in plain.client_state(k).items():
            torch.testing.assert_close(private.client_state(k)[name], value, rtol=1e-10, atol=0)
    owners = {float(private.client_state(k)[NOISE]) for k in range(len(fed))}
    assert len(owners) == len(fed)  # each kept its own
    assert private.state[NOISE] == spec.initial_state()[NOISE]  # the server never learns them


def _context(spec, k):
    return ServerContext(
        spec, torch.ones(k, dtype=torch.long), torch.full((k,), 1 / k), list(range(k)), seed=0
    )


def test_the_server_noise_is_the_mechanisms_on_the_shared_values_and_none_on_the_personal(equal):
    """With personal noise and outputscale, the server's noise on the shared raw coordinates has
    standard deviation z·C/(qK) (2,000 rounds of 2 coordinates at a fixed seed: the sample sd's
    relative standard error is 1/sqrt(2·4,000) = 1.1 %; tolerance 5 %), and the personal values
    the server keeps for new owners do not move at all."""
    spec, _ = equal
    spec = spec.for_data([fedgp.data.ClientData(torch.zeros(3, 2), torch.arange(3.0), id=0)])
    strategy = DPFGPR(FGPR(server_optimizer=None, personal=PERSONAL), clip=0.2, noise=1.5, rate=0.25,
                      reproducible=True)  # fmt: skip
    k, theta = 40, spec.initial_state()
    nothing = Replies(
        torch.zeros(0, dtype=torch.long), torch.zeros(0), {}, {}, {}, torch.zeros(0, dtype=torch.long)
    )
    shared = [n for n in spec.trainable_names if n not in (NOISE, OUTPUTSCALE)]
    steps = []
    for rnd in range(2000):
        new, _ = strategy.aggregate(rnd, theta, None, nothing, _context(spec, k))
        assert torch.equal(new[NOISE], theta[NOISE]) and torch.equal(new[OUTPUTSCALE], theta[OUTPUTSCALE])
        raw, start = spec.to_raw(new), spec.to_raw(theta)
        steps.append(torch.cat([(raw[n] - start[n]).reshape(-1) for n in shared]))
    steps = torch.stack(steps)
    assert steps.shape == (2000, 2)  # the ARD lengthscale's two coordinates
    expected = 1.5 * 0.2 / (0.25 * k)
    assert float(steps.std()) == pytest.approx(expected, rel=0.05)
    assert abs(float(steps.mean())) < 4 * expected / math.sqrt(steps.numel())


def test_each_clients_noise_share_is_on_its_shared_update_only(equal):
    """noise_at="clients": a reply is its clipped shared update plus N(0, (zC)²/t) per shared
    trainable coordinate (the difference from the same client's noiseless reply, 150 rounds of
    6 clients' summed 2 coordinates: relative standard error 1/sqrt(2·300) = 4 %; tolerance 12 %);
    no reply names a personal hyper-parameter, and the clients keep theirs the same with or
    without the noise (it is added after training, to the reply)."""
    spec, fed = equal
    t = 2
    strategy = DPFGPR(FGPR(server_optimizer=None, local_steps=1, batch_size=None, personal=PERSONAL),
                      clip=0.2, noise=1.5, reproducible=True, noise_at="clients", noise_shares=t)  # fmt: skip
    clean = replace(strategy, noise_at="server", noise_shares=1)
    noisy_engine, clean_engine = (Sequential().build(spec, list(fed)) for _ in range(2))
    noisy_engine.start(strategy, 0)
    clean_engine.start(clean, 0)
    ctx = _context(noisy_engine.spec, len(fed))
    theta = noisy_engine.spec.initial_state()
    shares = []
    for rnd in range(150):
        plan = strategy.configure(rnd, theta, ctx, np.random.default_rng(rnd))
        assert not any(n.endswith((NOISE, OUTPUTSCALE)) for n in plan.replies)
        task = Task("train", rnd, plan.shared, plan.personal, {})
        out = noisy_engine.run(task, plan.participants, plan.replies)
        exact = clean_engine.run(task, plan.participants, plan.replies)
        assert not out.failures and set(out.sums) == set(plan.replies)
        trainable = [n for n in out.sums if n.removeprefix(UPDATE) in noisy_engine.spec.trainable_names]
        shares.append(torch.cat([(out.sums[n] - exact.sums[n]).reshape(-1) for n in trainable]))
    shares = torch.stack(shares)
    assert shares.shape == (150, 2)
    assert float(shares.std()) == pytest.approx(1.5 * 0.2 * math.sqrt(len(fed) / t), rel=0.12)
    assert noisy_engine.memory.keys() == clean_engine.memory.keys() == set(range(len(fed)))
    for key, kept in noisy_engine.memory.items():
        assert set(kept) == {NOISE, OUTPUTSCALE}
        for name, value in kept.items():
            assert torch.equal(value, clean_engine.memory[key][name])


def test_no_private_reply_holds_a_personal_value(equal, sent_records):
    """Through bytes (loopback): no training reply names a personal field or carries a personal
    value's bytes; every field is a summed update of a shared hyper-parameter."""
    spec, fed = equal
    engine = Sequential(loopback=True).build(spec, list(fed), 0)
    private = ClientDP(
        FGPR(local_steps=2, personal=PERSONAL), noise=0.5, clip=0.5, delta=1e-3, reproducible=True
    )
    result = _fit(spec, fed, private, rounds=3, engine=engine)
    training = [data for data in sent_records if UPDATE.encode() in data]
    assert len(training) == 3 * len(fed)
    replies = b"".join(training)
    assert b"noise" not in replies and b"outputscale" not in replies and b"lengthscale" in replies
    for k in range(len(fed)):
        for name in (NOISE, OUTPUTSCALE):
            value = result.client_state(k)[name].to(torch.float64)
            assert value.numpy().tobytes() not in replies
            assert value != spec.initial_state()[name]  # trained by its owner


def test_the_reported_epsilon_is_the_librarys_with_personal_values(equal):
    """The accountant is unchanged: the sensitivity is the clip on the shared update."""
    spec, fed = equal
    private = ClientDP(FGPR(personal=PERSONAL), noise=1.3, rate=0.4, delta=1e-3, reproducible=True)
    result = _fit(spec, fed, private, rounds=3, engine="batched")
    accountant = rdp.RdpAccountant()
    expected = []
    for _ in range(3):
        accountant.compose(dp_accounting.PoissonSampledDpEvent(0.4, dp_accounting.GaussianDpEvent(1.3)))
        expected.append(accountant.get_epsilon(1e-3))
    np.testing.assert_allclose(result.history["epsilon"].to_numpy(), expected, rtol=1e-12)


def test_engines_agree_on_a_private_run_with_personal_values(equal):
    """Sequential and batched (every owner's own values, noise drawn from the seed), both noise_at."""
    spec, fed = equal
    for where in ({}, {"noise_at": "clients", "noise_shares": 2}):
        private = ClientDP(FGPR(local_steps=2, batch_size=8, personal=("noise",)), noise=0.8, rate=0.7,
                           delta=1e-3, reproducible=True, **where)  # fmt: skip
        a, b = (_fit(spec, fed, private, rounds=3, engine=e) for e in ("sequential", "batched"))
        assert a.state.allclose(b.state, rtol=1e-8)
        for k in range(len(fed)):
            torch.testing.assert_close(
                a.client_state(k)[NOISE], b.client_state(k)[NOISE], rtol=1e-8, atol=1e-12
            )


def test_a_strategy_with_nothing_shared_is_refused_naming_why(equal):
    spec, fed = equal
    everything = FGPR(personal=("noise", "outputscale", "lengthscale"))
    refused = r"ClientDP does not apply to FGPR\(personal=.*every trainable hyper-parameter is personal"
    with pytest.raises(InputError, match=refused):
        _fit(spec, fed, ClientDP(everything, noise=1.0, delta=1e-3))


SPEC = fedgp.GPSpec(mean=gpytorch.means.ConstantMean()).for_data(
    [fedgp.data.ClientData(torch.zeros(3, 1), torch.arange(3.0), id=0)]
)
NAMES = [p.name for p in SPEC.params]


@settings(max_examples=25, deadline=None)
@given(
    chosen=st.sets(st.sampled_from(NAMES), max_size=len(NAMES) - 1), at=st.sampled_from(["server", "clients"])
)
def test_the_private_reply_is_every_shared_update_summed_and_no_personal_one(chosen, at):
    """Whatever proper subset is personal, ClientDP's strategy declares a summed update of every
    shared hyper-parameter and nothing of a personal one (the run's contract checks replies
    against this)."""
    shares = {"noise_shares": 2} if at == "clients" else {}
    private = ClientDP(FGPR(personal=tuple(sorted(chosen))), noise=1.0, delta=1e-3, noise_at=at, **shares)
    strategy = private.build(SPEC, rounds=2)
    declared = strategy.reply_fields(probe_context(SPEC))
    assert set(declared) == {UPDATE + n for n in NAMES if n not in chosen}
    assert all(f.summed for f in declared.values())
    assert strategy.personal_names(SPEC) == frozenset(chosen) and strategy.keeps_client_memory == bool(chosen)
