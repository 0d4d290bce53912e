import numpy as np
import pytest
import torch

from fedgp.rng import (
    client_uniform,
    draw_minibatches,
    generator,
    nearest_neighbour_minibatches,
    uniform_minibatches,
)


def test_client_draws_do_not_depend_on_who_else_is_drawn():
    alone = client_uniform(7, "minibatch", 3, [42], (5, 4))
    crowd = client_uniform(7, "minibatch", 3, [1, 42, 9000], (5, 4))
    assert torch.equal(alone[0], crowd[1])
    assert not torch.equal(crowd[0], crowd[1])
    assert not torch.equal(alone, client_uniform(7, "minibatch", 4, [42], (5, 4)))
    assert not torch.equal(alone, client_uniform(8, "minibatch", 3, [42], (5, 4)))
    assert not torch.equal(alone, client_uniform(7, "gradient", 3, [42], (5, 4)))


def test_client_uniform_is_uniform():
    u = client_uniform(0, "x", 0, np.arange(200), (500,)).flatten().numpy()
    assert 0.0 <= u.min() and u.max() < 1.0
    hist = np.histogram(u, bins=20, range=(0, 1))[0]
    expected = len(u) / 20
    chi2 = ((hist - expected) ** 2 / expected).sum()
    assert chi2 < 45  # 19 dof, p ~ 1e-3


def test_uniform_minibatches_are_subsets_and_uniform():
    sizes = torch.tensor([10] * 20000)
    u = client_uniform(1, "minibatch", 0, np.arange(20000), (4,))
    idx = uniform_minibatches(u, sizes, 4)
    assert idx.min() >= 0 and idx.max() < 10
    assert all(len(set(row)) == 4 for row in idx[:500].tolist())
    counts = torch.bincount(idx.flatten(), minlength=10).double()
    assert float((counts / counts.sum() - 0.1).abs().max()) < 0.01
    # every pair equally likely: Floyd gives uniform subsets, not just uniform marginals
    pairs = torch.zeros(10, 10)
    for row in idx.tolist():
        for a in row:
            for b in row:
                if a < b:
                    pairs[a, b] += 1
    off = pairs[torch.triu(torch.ones(10, 10), 1).bool()]
    assert float(off.std() / off.mean()) < 0.05


def test_uniform_minibatches_reject_small_clients():
    with pytest.raises(ValueError, match="at least batch_size"):
        uniform_minibatches(torch.rand(1, 5), torch.tensor([3]), 5)


def test_nearest_neighbour_minibatches_match_brute_force():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(2, 30, 2, generator=g, dtype=torch.float64)
    sizes = torch.tensor([30, 17])
    u = torch.rand(2, 3, generator=g, dtype=torch.float64)
    idx = nearest_neighbour_minibatches(u, X, sizes, 5)
    for b in range(2):
        for s in range(3):
            centre = int(u[b, s] * sizes[b])
            d = ((X[b, : sizes[b]] - X[b, centre]) ** 2).sum(-1)
            assert set(idx[b, s].tolist()) == set(torch.argsort(d)[:5].tolist())
            assert idx[b, s, 0] == centre and idx[b, s].max() < sizes[b]


def test_draw_minibatches_per_client_rows_independent_of_batch():
    sizes = torch.tensor([50, 80, 120])
    both = draw_minibatches(0, 2, torch.tensor([4, 7, 9]), sizes, 3, 16)
    one = draw_minibatches(0, 2, torch.tensor([7]), sizes[1:2], 3, 16)
    assert torch.equal(both[1], one[0])


def test_server_generator_is_reproducible():
    assert generator(0, "sample", 3).integers(1 << 30) == generator(0, "sample", 3).integers(1 << 30)
    assert generator(0, "sample", 3).integers(1 << 30) != generator(0, "sample", 4).integers(1 << 30)


def test_compiled_and_tensor_floyd_give_the_same_minibatches(monkeypatch):
    import fedgp.rng

    if fedgp.rng._numba is None:
        pytest.skip("numba is not installed: only the tensor loop exists")
    g = torch.Generator().manual_seed(0)
    for m, rows in ((32, 400), (5, 300), (2, 50)):
        u = client_uniform(0, "minibatch", 3, np.arange(rows), (m,))
        sizes = torch.randint(m, m + 60, (rows,), generator=g)
        sizes[: rows // 4] = m  # N == m: every draw after the first collides somewhere
        compiled = uniform_minibatches(u, sizes, m)
        monkeypatch.setattr(fedgp.rng, "_numba", None)
        assert torch.equal(compiled, uniform_minibatches(u, sizes, m))
        monkeypatch.undo()
