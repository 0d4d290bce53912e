import gpytorch
import pytest
import torch

from fedgp import GPSpec, HyperState
from fedgp.synthetic.draws import gp_spec


def test_state_names_units_and_round_trip():
    spec = gp_spec(3)
    state = spec.initial_state()
    assert set(state) == {
        "likelihood.noise_covar.noise",
        "covar_module.outputscale",
        "covar_module.base_kernel.lengthscale",
    }
    # GPyTorch defaults: softplus(0) = log 2, noise bound 1e-4 added
    assert torch.isclose(
        state["covar_module.outputscale"], torch.tensor(0.6931471805599453, dtype=torch.float64)
    )
    assert torch.allclose(
        spec.from_raw(spec.to_raw(state))["likelihood.noise_covar.noise"],
        state["likelihood.noise_covar.noise"],
    )
    other = spec.state(
        {"covar_module.base_kernel.lengthscale": [[0.1, 0.2, 0.3]], "covar_module.outputscale": 4.0}
    )
    model = spec.build()
    spec.load(model, other)
    assert torch.allclose(
        model.covar_module.base_kernel.lengthscale,
        torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64),
    )
    assert torch.isclose(model.covar_module.outputscale, torch.tensor(4.0, dtype=torch.float64))
    assert spec.read(model).allclose(other, rtol=1e-12)


@pytest.mark.parametrize("value", [0.0, 1e-300, 5e-324])
def test_a_value_on_its_constraints_bound_has_a_finite_raw_value(value):
    """A softplus that underflowed gives a lengthscale of exactly 0 or a noise exactly at its floor;
    GPyTorch's inverse of it is -inf, and one such client made the server's raw average NaN."""
    spec = GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)),
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.Interval(1e-4, 2.0)
        ),
    )
    state = spec.state({
        "covar_module.base_kernel.lengthscale": [[value, 1.0]],
        "likelihood.noise_covar.noise": 1e-4,  # the interval's lower end
    })  # fmt: skip
    raw = spec.to_raw(state)
    assert all(bool(torch.isfinite(v).all()) for v in raw.values())
    back = spec.from_raw(raw)
    assert torch.allclose(back["covar_module.base_kernel.lengthscale"],
                          torch.tensor([[value, 1.0]], dtype=torch.float64), rtol=0, atol=1e-300)  # fmt: skip
    assert back["likelihood.noise_covar.noise"] == pytest.approx(1e-4, rel=1e-12)
    top = spec.to_raw(spec.state({"likelihood.noise_covar.noise": 2.0}))  # the upper end
    assert torch.isfinite(top["likelihood.noise_covar.noise"]).all()
    inside = spec.state({"covar_module.base_kernel.lengthscale": [[0.3, 2.0]]})
    assert torch.equal(  # values inside are untouched
        spec.to_raw(inside)["covar_module.base_kernel.lengthscale"],
        spec.params[-1].constraint.inverse_transform(inside["covar_module.base_kernel.lengthscale"]),
    )


def test_spec_copies_user_modules_and_applies_initial_values():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5))
    spec = GPSpec(kernel=kernel, initial_values={"likelihood.noise_covar.noise": 10.0})
    spec.load(spec.build(), spec.state({"covar_module.outputscale": 9.0}))
    assert torch.isclose(kernel.outputscale, torch.tensor(0.6931, dtype=kernel.outputscale.dtype), atol=1e-4)
    assert float(spec.initial_state()["likelihood.noise_covar.noise"]) == pytest.approx(10.0)


def test_fixed_parameters_and_unknown_names():
    spec = GPSpec(mean=gpytorch.means.ConstantMean(), fixed=["likelihood.noise_covar.noise"])
    assert "likelihood.noise_covar.noise" not in spec.trainable_names
    assert "mean_module.raw_constant" in spec.names or "mean_module.constant" in spec.names
    with pytest.raises(ValueError, match="not hyper-parameters"):
        GPSpec(fixed=["likelihood.nosie"])
    with pytest.raises(KeyError, match="unknown hyper-parameter 'covar_module.lengthscale'"):
        GPSpec().state({"covar_module.lengthscale": 1.0})
    with pytest.raises(TypeError, match="Gaussian likelihood"):
        GPSpec(likelihood=gpytorch.likelihoods.BernoulliLikelihood())


def test_hyperstate_batching_helpers():
    spec = gp_spec(2)
    s = spec.initial_state()
    batch = s.expand(3, 4)
    assert batch.batch_shape == (3, 4)
    assert batch["covar_module.base_kernel.lengthscale"].shape == (3, 4, 1, 2)
    stacked = HyperState.stack([spec.state({"covar_module.outputscale": v}) for v in (1.0, 2.0, 3.0)])
    picked = stacked.expand(2).gather(torch.tensor([2, 0]))
    assert picked["covar_module.outputscale"].tolist() == [3.0, 1.0]
    mean = stacked.weighted_mean(torch.tensor([0.5, 0.25, 0.25]))
    assert float(mean["covar_module.outputscale"]) == pytest.approx(1.75)
    assert set(s.to_dict()) == {
        "likelihood.noise_covar.noise",
        "covar_module.outputscale",
        "covar_module.base_kernel.lengthscale[0]",
        "covar_module.base_kernel.lengthscale[1]",
    }
    with pytest.raises(ValueError, match="unbatched"):
        batch.to_dict()
    with pytest.raises(ValueError, match="batch shape"):
        HyperState({"a": torch.zeros(2), "b": torch.zeros(3)}, {"a": (), "b": ()})
