"""Full GPyTorch models on every engine: float32, priors, active_dims, FixedNoise, constrained
names, the per-client fallback and ``engine="auto"`` (issue 16, parts 2 and 3)."""

import math
import warnings

import gpytorch
import pytest
import torch

import fedgp
from fedgp import GPSpec
from fedgp.data import ClientData, Federation
from fedgp.engines.batched import BatchedEngine
from fedgp.engines.sequential import SequentialEngine
from fedgp.experiments.prior_map import centralised_map, prior_spec
from fedgp.strategies import FGPR
from fedgp.strategies.local import SGD
from fedgp.synthetic import gp_federation


def fit_on(engine, spec, fed, strategy=None, rounds=3, **kwargs):
    strategy = FGPR(local_steps=3, batch_size=16) if strategy is None else strategy
    # the references here (GPyTorch, closed forms, the centralised MAP) see the data as given
    kwargs.setdefault("transforms", None)
    return fedgp.fit(spec, fed, strategy, engine=engine, rounds=rounds, seed=2, **kwargs)


@pytest.fixture(scope="module")
def draws():
    return gp_federation(num_clients=4, n=[20, 30, 25, 40], d=3, n_test=6, seed=0)


def test_float32_fits_agree_across_engines_and_with_float64(draws):
    runs = {}
    for dtype in (torch.float32, torch.float64):
        spec = GPSpec(dtype=dtype)
        for engine in ("sequential", "batched"):
            runs[dtype, engine] = fit_on(engine, spec, draws.federation, rounds=4)
    s32, b32 = runs[torch.float32, "sequential"].state, runs[torch.float32, "batched"].state
    assert all(v.dtype == torch.float32 for v in s32.values())
    assert all(v.dtype == torch.float32 for v in b32.values())
    assert s32.max_relative_difference(b32) < 1e-4  # float32 rounding, two code paths
    # States cross the wire as float64 records: exact for float32 values, so bytes change nothing.
    wired = fit_on(
        fedgp.engines.Batched(loopback=True), GPSpec(dtype=torch.float32), draws.federation, rounds=4
    )
    assert wired.state.max_relative_difference(b32) == 0.0
    f64 = runs[torch.float64, "sequential"].state
    assert s32.map(lambda v, e: v.double()).max_relative_difference(f64) < 1e-3
    mean32, var32 = runs[torch.float32, "batched"].predict(draws.federation[0].X_test, client=0)
    mean64, var64 = runs[torch.float64, "sequential"].predict(draws.federation[0].X_test, client=0)
    assert torch.allclose(mean32.double(), mean64, atol=1e-3)
    assert torch.allclose(var32.double(), var64, rtol=1e-3)


def sum_spec(prior_weight=None):
    kernel = gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(
            ard_num_dims=2, active_dims=[0, 2], lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 6.0)
        )
    ) + gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.MaternKernel(nu=2.5, active_dims=[1]),
        outputscale_prior=gpytorch.priors.LogNormalPrior(0.0, 1.0),
    )
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=gpytorch.priors.GammaPrior(1.1, 0.5))
    return GPSpec(kernel, gpytorch.means.LinearMean(3), likelihood, prior_weight=prior_weight)


@pytest.mark.parametrize("prior_weight", [None, 0.01])
def test_sum_of_kernels_with_priors_active_dims_and_linear_mean_agree(draws, prior_weight):
    spec = sum_spec(prior_weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the tensor path, no fallback
        assert BatchedEngine(spec, draws.federation, 0).gp is not None
    seq = fit_on("sequential", spec, draws.federation)
    bat = fit_on("batched", spec, draws.federation)
    assert seq.state.max_relative_difference(bat.state) < 1e-8
    without = fit_on("batched", sum_spec(0.0), draws.federation)
    assert without.state.max_relative_difference(bat.state) > 1e-4  # the priors did enter the loss


def test_priors_enter_the_loss_as_gpytorch_marginal_likelihood_adds_them(draws):
    """Default weight 1/M: exactly GPyTorch's ExactMarginalLogLikelihood; a weight w: the data term
    per point minus w log p(θ)."""
    client = draws.federation[1]
    for weight in (None, 0.25):
        spec = sum_spec(weight)
        state = spec.initial_state()
        model = spec.build()
        spec.load(model, state)
        model.set_train_data(client.X, client.y, strict=False)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        data = model.likelihood(model(client.X)).log_prob(client.y) / client.n
        prior = sum(p.log_prob(c(m)).sum() for _, m, p, c, _ in model.named_priors())
        expected = -mll(model(client.X), client.y) if weight is None else -(data + weight * prior)
        for engine in (SequentialEngine, BatchedEngine):
            ops = engine(spec, [client], 0).ops(torch.tensor([0]), 0)
            assert float(ops.nll(state.expand(1))[0]) == pytest.approx(float(expected), rel=1e-12)


def test_prior_weight_one_over_n_makes_fedavgs_fixed_point_the_pooled_map():
    """At the centralised MAP θ*, one round of full-batch FedAvg (one local SGD step, raw-space
    averaging: a gradient step on Σ_k (n_k/N)(ℓ_k/n_k − w log p)) leaves θ* in place when w = 1/N,
    on both engines, and moves it with GPyTorch's per-batch scaling. The long run to the fixed point
    is `fedgp reproduce prior-map` (results/prior_map.csv)."""
    fed = gp_federation(num_clients=3, n=[8, 16, 32], d=1, seed=0).federation
    map_state = centralised_map(prior_spec(), fed)
    start = {k: float(v) for k, v in map_state.items()}
    step = FGPR(  # FedAvg: the server takes the average (no server optimiser)
        local_steps=1, batch_size=None, optimizer=SGD(lr=0.5, schedule="constant"), average_space="raw",
        server_optimizer=None,
    )  # fmt: skip
    for engine in ("sequential", "batched"):
        right = fit_on(
            engine, prior_spec(1.0 / 56, start), fed, step, rounds=1, callbacks=[fedgp.run.Evaluate(every=0)]
        ).state
        assert right.max_relative_difference(map_state) < 1e-8
        default = fit_on(
            engine, prior_spec(None, start), fed, step, rounds=1, callbacks=[fedgp.run.Evaluate(every=0)]
        ).state
        assert default.max_relative_difference(map_state) > 1e-3


def with_noise(fed, scale=1.0):
    return Federation(
        [
            ClientData(
                c.X,
                c.y,
                id=c.id,
                X_test=c.X_test,
                y_test=c.y_test,
                noise=scale * (0.05 + 0.01 * torch.arange(c.n)),
            )
            for c in fed
        ]
    )


def test_fixed_noise_likelihood_uses_each_clients_own_noise(draws):
    fed = with_noise(draws.federation)
    spec = GPSpec(
        likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
            noise=torch.ones(1), learn_additional_noise=True
        ),
        ard=False,  # one lengthscale: the closed form below
    )
    assert not any("noise_covar.noise" in name and "second" not in name for name in spec.names)
    # The NLL is the closed form with K + diag(known noise + learned extra noise).
    client, state = fed[0], spec.initial_state()
    ops = SequentialEngine(spec, [client], 0).ops(torch.tensor([0]), 0)
    s = float(state["covar_module.outputscale"])
    ls = float(state["covar_module.base_kernel.lengthscale"])
    extra = float(state["likelihood.second_noise_covar.noise"])
    K = s * torch.exp(-0.5 * torch.cdist(client.X / ls, client.X / ls) ** 2)
    K = K + torch.diag(client.noise + extra)
    expected = -torch.distributions.MultivariateNormal(torch.zeros(client.n), K).log_prob(client.y) / client.n
    assert float(ops.nll(state.expand(1))[0]) == pytest.approx(float(expected), rel=1e-10)
    # Both engines (the batched one per client, with a warning) agree; the noise changes the fit.
    seq = fit_on("sequential", spec, fed)
    with pytest.warns(UserWarning, match="client by client"):
        bat = fit_on("batched", spec, fed)
    assert seq.state.max_relative_difference(bat.state) < 1e-12
    noisier = fit_on("sequential", spec, with_noise(draws.federation, 3.0))
    assert noisier.state.max_relative_difference(seq.state) > 1e-3
    with pytest.raises(ValueError, match=r"client 0: .*FixedNoiseGaussianLikelihood.*noise="):
        fit_on("sequential", spec, draws.federation)


def test_client_noise_is_validated_like_y(draws):
    c = draws.federation[0]
    with pytest.raises(ValueError, match=r"client 'a': noise must have one variance per training point"):
        ClientData(c.X, c.y, id="a", noise=torch.ones(c.n + 1))
    with pytest.raises(ValueError, match=r"client 'a': noise variances must be > 0"):
        ClientData(c.X, c.y, id="a", noise=torch.zeros(c.n))
    with pytest.raises(ValueError, match=r"client 'a': noise contains 1 non-finite"):
        ClientData(c.X, c.y, id="a", noise=torch.tensor([math.nan] + [1.0] * (c.n - 1)))
    split = ClientData(c.X, c.y, id="a", noise=torch.arange(1.0, c.n + 1)).split(0.25, 0)
    assert split.noise.shape == (split.n,)


def test_constrained_and_raw_names_are_accepted_for_every_parameter():
    spec = GPSpec(
        mean=gpytorch.means.ConstantMean(),
        initial_values={"mean_module.constant": 3.0, "covar_module.base_kernel.raw_lengthscale": 0.0},
        fixed=["mean_module.constant", "covar_module.raw_outputscale"],
    )
    state = spec.initial_state()
    assert float(state["mean_module.raw_constant"]) == 3.0
    assert float(state["covar_module.base_kernel.lengthscale"]) == pytest.approx(math.log(2.0))  # softplus(0)
    assert set(spec.names) - set(spec.trainable_names) == {
        "mean_module.raw_constant",
        "covar_module.outputscale",
    }
    assert float(spec.state({"mean_module.constant": 2.0})["mean_module.raw_constant"]) == 2.0
    with pytest.raises(ValueError, match="state values are constrained"):
        spec.state({"covar_module.raw_outputscale": 1.0})


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_kernel_width_that_does_not_match_the_data_is_named(draws, engine):
    ard = GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))
    with pytest.raises(
        ValueError, match=r"covar_module.base_kernel \(RBFKernel\) has ard_num_dims=2 but client 0 has 3"
    ):
        fit_on(engine, ard, draws.federation)
    active = GPSpec(kernel=gpytorch.kernels.RBFKernel(active_dims=[0, 5]))
    with pytest.raises(ValueError, match=r"active_dims=\[0, 5\] but client 0 has 3 input features"):
        fit_on(engine, active, draws.federation)
    mean = GPSpec(mean=gpytorch.means.LinearMean(2))
    with pytest.raises(
        ValueError, match=r"mean_module \(LinearMean\) takes 2 input features .* input_size=3"
    ):
        fit_on(engine, mean, draws.federation)


def test_auto_engine_picks_batched_where_it_applies(draws):
    from fedgp.engines import Batched, Sequential, auto_engine, build_engine

    assert isinstance(auto_engine(GPSpec(), draws.federation), Batched)
    assert isinstance(build_engine("auto", GPSpec(), draws.federation, 0), BatchedEngine)
    fixed = GPSpec(likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=torch.ones(1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert auto_engine(fixed, with_noise(draws.federation)) == Sequential()
        assert isinstance(build_engine("auto", fixed, with_noise(draws.federation), 0), SequentialEngine)
    auto = fedgp.fit(
        GPSpec(),
        draws.federation,
        FGPR(local_steps=2),
        rounds=2,
        seed=2,
        transforms=fedgp.transforms.Transforms(outcome=None),
    )
    assert auto.engine.name == "batched"
    seq = fit_on(
        "sequential",
        GPSpec(),
        draws.federation,
        FGPR(local_steps=2),
        rounds=2,
        transforms=fedgp.transforms.Transforms(outcome=None, inputs="auto"),
    )
    assert auto.state.max_relative_difference(seq.state) < 1e-10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batched_engine_on_a_gpu_matches_the_cpu(draws):
    spec = sum_spec()  # once: LinearMean draws its initial weights at random on construction
    cpu = fit_on("batched", spec, draws.federation)
    gpu = fit_on(fedgp.engines.Batched(device="cuda"), spec, draws.federation)
    assert gpu.engine.X.is_cuda
    assert gpu.state.max_relative_difference(fit_on("sequential", spec, draws.federation).state) < 1e-8
    mean, var = gpu.predict(draws.federation[0].X_test, client=0)
    ref_mean, ref_var = cpu.predict(draws.federation[0].X_test, client=0)
    assert torch.allclose(mean, ref_mean, rtol=1e-8) and torch.allclose(var, ref_var, rtol=1e-8)


def test_device_option_runs_the_tensor_path_where_asked(draws):
    cpu = fit_on("batched", GPSpec(), draws.federation)
    explicit = fit_on(fedgp.engines.Batched(device="cpu"), GPSpec(), draws.federation)
    assert explicit.engine.device == torch.device("cpu") and explicit.engine.name == "batched"
    assert explicit.engine.chunk_size == 512  # the CPU's default (a GPU's is larger: test_gpu.py)
    assert explicit.state.max_relative_difference(cpu.state) == 0.0
    with pytest.raises(TypeError, match="unexpected keyword argument 'device'"):
        fedgp.engines.Sequential(device="cpu")  # the device is an option of the tensor path only
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda', but this PyTorch sees no CUDA GPU"):
            fit_on(fedgp.engines.Batched(device="cuda"), GPSpec(), draws.federation)
