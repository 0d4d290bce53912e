import pytest
import torch

from fedgp.strategies import SGD, Adam, LocalTraining


def test_adam_matches_torch_optim_adam_step_for_step():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(3, 4, generator=g, dtype=torch.float64)
    p_torch = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([p_torch], lr=0.03)
    ours = Adam(lr=0.03)
    params = {"w": torch.zeros(3, 4, dtype=torch.float64)}
    state = ours.init(params)
    for t in range(25):
        loss = ((p_torch - target) ** 4).sum()
        opt.zero_grad()
        loss.backward()
        grad = {"w": p_torch.grad.clone()}
        opt.step()
        params = ours.step(params, grad, state, torch.tensor(t), None)
        assert torch.allclose(params["w"], p_torch.detach(), rtol=1e-13, atol=1e-15)


def test_masked_steps_leave_inactive_clients_untouched():
    ours = Adam(lr=0.1)
    params = {"w": torch.zeros(2, 3, dtype=torch.float64)}
    state = ours.init(params)
    grad = {"w": torch.ones(2, 3, dtype=torch.float64)}
    new = ours.step(params, grad, state, torch.tensor([0, 0]), torch.tensor([True, False]))
    assert torch.all(new["w"][0] < 0) and torch.all(new["w"][1] == 0)
    assert state["t"]["w"][0].tolist() == [1, 1, 1] and state["t"]["w"][1].tolist() == [0, 0, 0]
    # a client that starts late takes exactly the step a fresh Adam would take
    late = ours.step(new, grad, state, torch.tensor([1, 1]), torch.tensor([False, True]))
    assert torch.allclose(late["w"][1], new["w"][0])


def test_sgd_inverse_t_schedule_uses_the_global_step():
    sgd = SGD(lr=1.0)
    params = {"w": torch.zeros(3, dtype=torch.float64)}
    grad = {"w": torch.ones(3, dtype=torch.float64)}
    out = sgd.step(params, grad, {}, torch.tensor([0, 1, 4]), None)
    # η_0 = β, η_t = β / t
    assert out["w"].tolist() == [-1.0, -1.0, -0.25]
    assert (
        SGD(lr=0.5, schedule="constant").step(params, grad, {}, torch.tensor([7, 7, 7]), None)["w"].tolist()
        == [-0.5] * 3
    )


def test_local_training_steps_and_batches():
    sizes = torch.tensor([10, 64, 200])
    epochs = LocalTraining(steps=None, epochs=2, batch_size=32)
    assert epochs.batch_sizes(sizes).tolist() == [10, 32, 32]
    assert epochs.num_steps(sizes).tolist() == [2, 4, 12]
    assert LocalTraining(steps=5, batch_size=None).batch_sizes(sizes).tolist() == [10, 64, 200]
    with pytest.raises(ValueError, match="exactly one of steps or epochs"):
        LocalTraining(steps=3, epochs=1)
    with pytest.raises(ValueError, match="minibatch"):
        LocalTraining(minibatch="random")
