"""Attacks: each forged reply against its definition, forged states stay valid, attackers and
draws are functions of the seed, every engine runs the same attack, and label flipping is exactly
training on −y."""

from dataclasses import replace

import gpytorch
import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given

import fedgp
from fedgp import GPSpec, attacks
from fedgp.aggregators import CoordinateMedian
from fedgp.data import Federation
from fedgp.engines.sequential import SequentialEngine
from fedgp.models import ZeroKernel
from fedgp.run.exchange import exchange
from fedgp.strategies import FGPR, IFCA, FederatedClustering
from fedgp.strategies import clustered as C
from fedgp.synthetic import gaussian_mixed_regression, gp_federation

T = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731

# one group of 5 rows, 2 slots, 2 coordinates; rows 3 and 4 attacked
U = T(
    [
        [[1.0, 2.0], [0.0, 1.0]],
        [[3.0, 2.0], [1.0, 1.0]],
        [[2.0, 5.0], [2.0, 4.0]],
        [[9.0, 9.0], [9.0, 9.0]],
        [[-7.0, 0.0], [0.0, -7.0]],
    ]
)
ATTACKED = torch.tensor([False, False, False, True, True])
HONEST = ~ATTACKED
OWNERS = torch.tensor([[10, 12]] * 5)  # slot 0 is client 10's model, slot 1 client 12's
POSITIONS = torch.tensor([10, 11, 12, 13, 14])

RAW = {"transforms": None}  # fit on the data as given


def forge(attack, rng=None):
    return attack.forge(U, HONEST, ATTACKED, OWNERS, POSITIONS, rng or np.random.default_rng(0))


def test_each_reply_attack_by_its_definition():
    honest = U[HONEST]
    assert torch.equal(forge(attacks.SignFlip(count=2)), -U[ATTACKED])
    assert torch.equal(forge(attacks.BitFlip(count=2)), -U[0].expand(2, 2, 2))
    assert torch.allclose(forge(attacks.IPM(count=2, epsilon=0.5)), (-0.5 * honest.mean(0)).expand(2, 2, 2))
    # ALIE: n = 5, f = 2: s = ⌊5/2 + 1⌋ − 2 = 1, z = Φ⁻¹(4/5) = 0.8416
    z = 0.8416212335729143
    assert attacks.ALIE(count=2).z_value(5, 2) == pytest.approx(z)
    assert attacks.ALIE(count=5).z_value(25, 5) == pytest.approx(0.4676988, rel=1e-6)  # Φ⁻¹(0.68)
    assert torch.allclose(forge(attacks.ALIE(count=2)), (honest.mean(0) - z * honest.std(0)).expand(2, 2, 2))
    gauss = forge(attacks.Gaussian(count=2), np.random.default_rng(3))
    draws = np.random.default_rng(3).standard_normal((2, 2, 2))
    assert torch.allclose(gauss, torch.from_numpy(draws) * 200 + 1e6)
    mimic = forge(attacks.Mimic(count=2))
    assert any(torch.equal(mimic[0], U[i]) for i in range(3)) and torch.equal(mimic[0], mimic[1])


def test_edge_of_ball_sits_between_the_victim_and_another_cluster():
    # slot 0 is client 10's (row 0), slot 1 client 12's (row 2); labels: 10 and 11 together, 12 apart
    labels = (0,) * 10 + (0, 0, 1, -1, -1)
    got = forge(attacks.EdgeOfBall(count=2, labels=labels))
    assert torch.allclose(got[0, 0], U[0, 0] + 0.5 * (U[2, 0] - U[0, 0]))  # toward 12, the other cluster
    # slot 1: the victim is 12; of 10 and 11 (the other cluster) 11 is nearer: |(1, 1) − (2, 4)|² = 10 < 13
    assert torch.allclose(got[0, 1], U[2, 1] + 0.5 * (U[1, 1] - U[2, 1]))
    blind = forge(attacks.EdgeOfBall(count=2))  # no labels: toward the farthest honest update
    far = int(torch.argmax((U[[1, 2], 0] - U[0, 0]).norm(dim=-1))) + 1
    assert torch.allclose(blind[0, 0], U[0, 0] + 0.5 * (U[far, 0] - U[0, 0]))


def test_attack_settings_are_checked():
    with pytest.raises(ValueError, match="exactly one of"):
        attacks.BitFlip()
    with pytest.raises(ValueError, match="exactly one of"):
        attacks.BitFlip(fraction=0.2, count=2)
    with pytest.raises(ValueError, match="fraction must be in"):
        attacks.Gaussian(fraction=1.0)
    with pytest.raises(ValueError, match="no client with id"):
        attacks.SignFlip(clients=["nobody"]).attackers([0, 1, 2], seed=0)
    with pytest.raises(ValueError, match="need at least one of each"):
        attacks.SignFlip(count=3).attackers([0, 1, 2], seed=0)
    with pytest.raises(ValueError, match="no finite z"):
        attacks.ALIE(count=1).z_value(4, 3)


@pytest.fixture(scope="module")
def draws():
    return gp_federation(num_clients=8, n=30, d=1, seed=2, n_test=10)


def run(draws, strategy, attack, engine="sequential", seed=1, rounds=3):
    return fedgp.fit(
        draws.spec,
        draws.federation,
        strategy,
        engine=engine,
        rounds=rounds,
        seed=seed,
        faults=fedgp.run.Faults(attack=attack),
        callbacks=[fedgp.run.Evaluate(every=0)],
    )


def test_attackers_and_draws_are_functions_of_the_seed(draws):
    strategy = FGPR(batch_size=10, aggregator=CoordinateMedian())
    a = run(draws, strategy, attacks.Gaussian(fraction=0.25))
    b = run(draws, strategy, attacks.Gaussian(fraction=0.25))
    assert a.attackers == b.attackers and len(a.attackers) == 2
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    others = {
        tuple(run(draws, strategy, attacks.Gaussian(fraction=0.25), seed=s, rounds=1).attackers)
        for s in range(6)
    }
    assert len(others) > 1  # another seed, other attackers
    given = run(draws, strategy, attacks.Gaussian(clients=[5, 1]), rounds=1)
    assert given.attackers == [1, 5]


ATTACKS = [
    attacks.Gaussian(fraction=0.25),
    attacks.BitFlip(fraction=0.25),
    attacks.SignFlip(fraction=0.25),
    attacks.IPM(fraction=0.25),
    attacks.ALIE(fraction=0.25),
    attacks.Mimic(fraction=0.25),
    attacks.EdgeOfBall(fraction=0.25),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: type(a).__name__)
def test_every_engine_runs_the_same_attack_and_forged_states_stay_valid(draws, attack):
    strategy = FGPR(batch_size=10, aggregator=CoordinateMedian())
    seq = run(draws, strategy, attack)
    bat = run(draws, strategy, attack, "batched")
    for k in seq.state:
        assert torch.allclose(seq.state[k], bat.state[k], rtol=1e-8), k
    # the plain mean of the forged states: every constrained value positive and finite
    mean = run(draws, FGPR(batch_size=10), attack)
    assert all(bool(torch.isfinite(v).all() and (v > 0).all()) for v in mean.state.values())


def test_honest_replies_are_untouched_and_forged_ones_are_what_the_attack_says(draws, monkeypatch):
    import fedgp.run.loop as loop_module  # where the round loop looks ``exchange`` up

    seen, captured = {}, []

    class Spy(SequentialEngine):
        def run(self, task, clients, fields):
            out = super().run(task, clients, fields)
            seen.update({k: v.clone() for k, v in out.individual.items()})
            return out

    def spying(*args, **kw):
        done = exchange(*args, **kw)
        captured.append(done.replies)
        return done

    monkeypatch.setattr(loop_module, "exchange", spying)
    spec, name = draws.spec, "covar_module.base_kernel.lengthscale"
    engine = Spy(spec, draws.federation)
    result = fedgp.fit(
        spec,
        None,
        FGPR(batch_size=10),
        engine=engine,
        rounds=1,
        faults=fedgp.run.Faults(attack=attacks.SignFlip(clients=[3])),
        callbacks=[fedgp.run.Evaluate(every=0)],
    )
    replies, field = captured[-1], "state/" + name
    rows = replies.participants.tolist()
    for i, p in enumerate(rows):
        if p != 3:
            assert torch.equal(replies[field][i], seen[field][i])
    raw = lambda v: torch.log(torch.expm1(v))  # noqa: E731 - softplus⁻¹, GPyTorch's Positive()
    start, mine = raw(spec.initial_state()[name]), rows.index(3)
    assert torch.allclose(raw(replies[field][mine]) - start, -(raw(seen[field][mine]) - start))
    assert result.attackers == [3]


def test_summed_fields_cannot_be_forged_and_model_averaging_can(draws):
    with pytest.raises(ValueError, match="summed fields"):
        run(draws, IFCA(num_clusters=2, aggregation="gradient"), attacks.BitFlip(count=2), rounds=1)
    strategy = IFCA(num_clusters=2, batch_size=10, restarts=2)
    seq = run(draws, strategy, attacks.BitFlip(count=2))
    bat = run(draws, strategy, attacks.BitFlip(count=2), "batched")
    assert all(torch.allclose(seq.state[k], bat.state[k], rtol=1e-8) for k in seq.state)


def test_federated_clustering_resists_large_gradients_on_both_engines():
    data = gaussian_mixed_regression(k=2, d=3, sizes=[12] * 10, noise=0.1, labels="balanced", seed=0)
    spec = linear_spec()
    fc = FederatedClustering(lr=0.05, group_size=5)
    results = [
        fedgp.fit(
            spec,
            data.federation,
            fc,
            engine=e,
            rounds=4,
            faults=fedgp.run.Faults(attack=attacks.Gaussian(count=2)),
        )
        for e in ("sequential", "batched")
    ]
    w = "mean_module.weights"
    assert torch.allclose(results[0].state[w], results[1].state[w], rtol=1e-8)
    assert float(results[0].state[w].abs().max()) < 10  # no 10⁶ ever got in


# -- label flipping ------------------------------------------------------------------------------------------


def linear_spec(d=3):
    noise = "likelihood.noise_covar.noise"
    return GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        mean=gpytorch.means.LinearMean(d),
        initial_values={
            noise: 0.2,
            "mean_module.weights": torch.zeros(d, 1),
            "mean_module.bias": torch.zeros(1),
        },
    )


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_label_flip_is_training_on_minus_y(engine):
    data = gaussian_mixed_regression(k=2, d=3, sizes=[15] * 6, noise=0.1, labels="balanced", seed=1)
    spec = linear_spec()
    flipped = Federation([replace(c, y=-c.y) if c.id in (1, 4) else c for c in data.federation])
    for strategy in (
        FGPR(batch_size=8),
        FederatedClustering(lr=0.05, radius=fedgp.clustering.QuantileRadius(0.5)),
    ):
        # transforms off: the reference flips raw y, whose federation mean differs from the attacked run's
        attacked = fedgp.fit(
            spec,
            data.federation,
            strategy,
            engine=engine,
            rounds=3,
            **RAW,
            faults=fedgp.run.Faults(attack=attacks.LabelFlip(clients=[1, 4])),
        )
        truth = fedgp.fit(spec, flipped, strategy, engine=engine, rounds=3, **RAW)
        for k in truth.state:
            assert torch.allclose(attacked.state[k], truth.state[k], rtol=1e-9, atol=1e-12), (strategy, k)


def test_label_flip_closed_forms_read_minus_y_and_a_zero_mean_cannot_tell():
    data = gaussian_mixed_regression(k=2, d=3, sizes=[15] * 6, noise=0.1, labels="balanced", seed=1)
    noise = "likelihood.noise_covar.noise"
    start = {noise: 0.04, "mean_module.weights": torch.zeros(3, 1)}
    spec = GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(3, bias=False),
        initial_values=start,
        fixed=[noise],
    )
    flipped = Federation([replace(c, y=-c.y) if c.id == 2 else c for c in data.federation])
    strategy = C.fedavg(lr=0.1)
    a = fedgp.fit(
        spec,
        data.federation,
        strategy,
        rounds=3,
        faults=fedgp.run.Faults(attack=attacks.LabelFlip(clients=[2])),
    )
    b = fedgp.fit(spec, flipped, strategy, rounds=3)
    assert torch.allclose(a.state["mean_module.weights"], b.state["mean_module.weights"], rtol=1e-12)
    draws = gp_federation(num_clients=4, n=20, d=1, seed=0)
    plain = fedgp.fit(draws.spec, draws.federation, FGPR(batch_size=8), rounds=2)
    flip = fedgp.fit(
        draws.spec,
        draws.federation,
        FGPR(batch_size=8),
        rounds=2,
        faults=fedgp.run.Faults(attack=attacks.LabelFlip(count=2)),
    )
    assert all(torch.equal(plain.state[k], flip.state[k]) for k in plain.state)


def test_label_flip_refuses_a_mean_that_is_not_linear_in_its_parameters():
    class Square(gpytorch.means.Mean):
        def __init__(self):
            super().__init__()
            self.register_parameter("a", torch.nn.Parameter(torch.tensor([1.0])))

        def forward(self, x):
            return (self.a**2) * x[..., 0]

    draws = gp_federation(num_clients=4, n=20, d=1, seed=0)
    spec = GPSpec(mean=Square())
    result = fedgp.fit(
        spec,
        draws.federation,
        FGPR(batch_size=8),
        rounds=1,
        faults=fedgp.run.Faults(min_replies=1, attack=attacks.LabelFlip(count=1)),
    )
    assert result.history["failed"].iloc[0] == 1
    assert "LabelFlip needs a mean linear" in result.failures["reason"].iloc[0]


# -- properties over arbitrary groups (hypothesis, derandomised in CI) ------------------------------
groups = st.integers(3, 8).flatmap(
    lambda m: st.tuples(
        st.lists(st.floats(-1e3, 1e3), min_size=m * 4, max_size=m * 4).map(
            lambda v, m=m: torch.tensor(v, dtype=torch.float64).reshape(m, 2, 2)
        ),
        st.lists(st.booleans(), min_size=m, max_size=m).filter(lambda a: 1 <= sum(a) <= len(a) - 2),
    )
)
BUILT_FROM_HONEST = [
    attacks.BitFlip(count=1),
    attacks.IPM(count=1),
    attacks.ALIE(count=1, z=1.0),
    attacks.Mimic(count=1),
    attacks.EdgeOfBall(count=1),
]


@given(groups, st.integers(0, 2**32 - 1))
def test_omniscient_attacks_read_only_the_honest_rows_and_forge_one_row_per_attacker(group, seed):
    updates, attacked = group
    attacked = torch.tensor(attacked)
    m = len(attacked)
    owners = torch.tensor([[0, 1]] * m)
    positions = torch.arange(m)
    scrambled = torch.where(attacked.reshape(-1, 1, 1), updates * -3 + 7, updates)
    for attack in BUILT_FROM_HONEST:
        a = attack.forge(updates, ~attacked, attacked, owners, positions, np.random.default_rng(seed))
        b = attack.forge(scrambled, ~attacked, attacked, owners, positions, np.random.default_rng(seed))
        assert a.shape == (int(attacked.sum()), 2, 2) and bool(torch.isfinite(a).all())
        assert torch.allclose(a, b, rtol=0, atol=1e-9), type(attack).__name__
    own = attacks.SignFlip(count=1).forge(updates, ~attacked, attacked, owners, positions, None)
    assert torch.equal(own, -updates[attacked])
    gauss = attacks.Gaussian(count=1)
    args = (updates, ~attacked, attacked, owners, positions)
    g1, g2 = (gauss.forge(*args, np.random.default_rng(seed)) for _ in "ab")
    assert torch.equal(g1, g2)  # a function of the round's generator alone


@given(st.integers(2, 60), st.floats(0.01, 0.99), st.integers(0, 2**32 - 1))
def test_attackers_are_a_seeded_draw_of_the_asked_size(n, fraction, seed):
    attack = attacks.SignFlip(fraction=fraction)
    count = int(round(fraction * n))
    if not 1 <= count < n:
        with pytest.raises(ValueError, match="need at least one of each"):
            attack.attackers(list(range(n)), seed)
        return
    chosen = attack.attackers([f"c{i}" for i in range(n)], seed)
    assert len(chosen) == count and torch.equal(chosen, torch.unique(chosen))
    assert 0 <= int(chosen.min()) and int(chosen.max()) < n
    assert torch.equal(chosen, attack.attackers([f"c{i}" for i in range(n)], seed))
