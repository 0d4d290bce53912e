"""Multi-output GPs (ICM, Hadamard form): against the one-output model, independent fits, GPyTorch's
own Hadamard multitask model, and federated on owners that miss outputs."""

from __future__ import annotations

import math
import warnings

import gpytorch
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data.client import ClientData, Federation
from fedgp.data.outputs import long_form, outputs_client
from fedgp.engines.batched import BatchedEngine
from fedgp.engines.hadamard_gp import HadamardBatchedGP
from fedgp.engines.tensor_gp import BatchedGP
from fedgp.errors import FedGPWarning, InputError, InputTypeError, UnsupportedSpec
from fedgp.models.multioutput import MultiOutputSpec, output_rows
from fedgp.models.posterior import condition, condition_client
from fedgp.transforms import Normalize, Standardize, Transforms

COVAR_FACTOR, TASK_VAR = "task_covar_module.covar_factor", "task_covar_module.var"


def _draws(seed: int, n: int, d: int = 1):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    f = torch.sin(6 * X.sum(1))
    return g, X, f


# -- T = 1 is the one-output model ------------------------------------------------------------------
def test_one_output_reproduces_the_single_output_fit_and_predictions():
    """T = 1, rank 0: B = v is the ScaleKernel's outputscale, the TaskMean the ConstantMean; the same
    FGPR fit (same seed, same transforms) reaches the same state and predictions to 1e-10."""
    clients, tests = [], []
    for k in range(3):
        g, X, f = _draws(k, 25)
        y = f + 0.1 * torch.randn(25, generator=g, dtype=torch.float64)
        clients.append(ClientData(X, y, id=k))
        tests.append(torch.rand(7, 1, generator=g, dtype=torch.float64))
    one = fedgp.GPSpec(
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), gpytorch.means.ConstantMean()
    )
    multi = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=1, rank=0)
    rows = [
        ClientData(torch.cat([c.X, torch.zeros(c.n, 1, dtype=torch.float64)], 1), c.y, id=c.id)
        for c in clients
    ]
    federated = Transforms(outcome=Standardize())  # 'auto' standardises each output so for T outputs
    a = fedgp.fit(one, Federation(clients), rounds=15, engine="sequential", seed=0, transforms=federated)
    b = fedgp.fit(multi, Federation(rows), rounds=15, engine="sequential", seed=0)
    pairs = [
        ("likelihood.noise_covar.noise", "likelihood.noise_covar.noise"),
        ("covar_module.base_kernel.lengthscale", "covar_module.lengthscale"),
        ("covar_module.outputscale", TASK_VAR),
        ("mean_module.raw_constant", "mean_module.constant"),
    ]
    assert set(b.state) == {name for _, name in pairs}  # rank 0: no W
    for single, many in pairs:
        assert torch.allclose(a.state[single].reshape(-1), b.state[many].reshape(-1), rtol=1e-10, atol=0)
    # and the fit moved away from the start, so the comparison is of trained states
    assert abs(float(b.state[TASK_VAR]) - math.log(2)) > 1e-3
    for k, X in enumerate(tests):
        mean_a, var_a = a.predict(X, client=k, observation_noise=True)
        mean_b, var_b = b.predict(output_rows(X, 1), client=k, observation_noise=True)
        assert torch.allclose(mean_a, mean_b, rtol=1e-10, atol=1e-12)
        assert torch.allclose(var_a, var_b, rtol=1e-10, atol=0)


# -- a diagonal task covariance is independent outputs ----------------------------------------------
def test_diagonal_task_covariance_gives_the_independent_fits_posterior():
    """Rank 0 (W empty, B = diag(v)): each output's posterior is the one-output GP's with outputscale
    v_t, on that output's rows alone; with W ≠ 0 it is not (the outputs then inform each other)."""
    g, X, f = _draws(5, 30)
    Y = torch.stack([f, 2 * f + 1], 1) + 0.1 * torch.randn(30, 2, generator=g, dtype=torch.float64)
    Y[::3, 0] = float("nan")
    Y[1::4, 1] = float("nan")
    client = outputs_client(X, Y, id="a")
    spec = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=2, rank=0, fixed=(TASK_VAR,))
    assert spec.param(TASK_VAR).trainable is False
    values = {
        "likelihood.noise_covar.noise": 0.02,
        "covar_module.lengthscale": 0.25,
        TASK_VAR: torch.tensor([1.5, 4.0]),
        "mean_module.constant": torch.tensor([0.1, 0.9]),
    }
    state = spec.state(values)
    X_new = torch.linspace(0, 1, 9, dtype=torch.float64)[:, None]
    joint = condition_client(spec, state, client, output_rows(X_new, 2))
    one = fedgp.GPSpec(
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), gpytorch.means.ConstantMean()
    )
    for t in range(2):
        seen = ~torch.isnan(Y[:, t])
        alone = one.state(
            {
                "likelihood.noise_covar.noise": 0.02,
                "covar_module.base_kernel.lengthscale": 0.25,
                "covar_module.outputscale": float(values[TASK_VAR][t]),
                "mean_module.constant": float(values["mean_module.constant"][t]),
            }
        )
        own = condition(one, alone, X[seen], Y[seen, t], X_new)
        assert torch.allclose(joint.mean.reshape(9, 2)[:, t], own.mean, rtol=1e-10, atol=1e-12)
        assert torch.allclose(joint.variance_y.reshape(9, 2)[:, t], own.variance_y, rtol=1e-10, atol=0)
    rank_one = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=2, rank=1)
    coupled = rank_one.state({**values, COVAR_FACTOR: torch.tensor([[0.8], [1.2]])})
    other = condition_client(rank_one, coupled, client, output_rows(X_new, 2))
    assert not torch.allclose(other.mean, joint.mean, rtol=1e-3)


def test_a_large_owner_is_conditioned_on_the_task_covariance_too(monkeypatch):
    """Above LARGE_CLIENT_ROWS a one-output posterior takes memory-lean paths that read the kernel
    alone; a multi-output owner's takes GPyTorch's path at every size, so its posterior is the same."""
    g, X, f = _draws(9, 40)
    Y = torch.stack([f, -f], 1) + 0.1 * torch.randn(40, 2, generator=g, dtype=torch.float64)
    client = outputs_client(X, Y)
    spec = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=2)
    state = spec.state({COVAR_FACTOR: torch.tensor([[1.0], [-0.9]]), "covar_module.lengthscale": 0.3})
    rows = output_rows(torch.linspace(0, 1, 5, dtype=torch.float64)[:, None], 2)
    small = condition_client(spec, state, client, rows)
    monkeypatch.setattr(fedgp.models.large, "LARGE_CLIENT_ROWS", 10)
    large = condition_client(spec, state, client, rows)
    assert torch.equal(large.mean, small.mean) and torch.equal(large.variance_y, small.variance_y)


def test_one_noise_per_output():
    """output_noise=True: GPyTorch's HadamardGaussianLikelihood reading the output column. With equal
    noises it is the shared-noise model; with different ones its posterior and marginal likelihood
    are the dense formula's, K_x∘B + diag(σ²_t) (to GPyTorch's kernel rounding); and FGPR learns
    two outputs' noise levels apart."""
    g, X, f = _draws(3, 30)
    Y = torch.stack([f, -f], 1) + torch.randn(30, 2, generator=g, dtype=torch.float64) * torch.tensor(
        [0.02, 0.4]
    )
    Y[::4, 1] = float("nan")
    client = outputs_client(X, Y)
    rows = output_rows(torch.linspace(0, 1, 4, dtype=torch.float64)[:, None], 2)
    common = {"covar_module.lengthscale": 0.3, COVAR_FACTOR: torch.tensor([[1.0], [-0.8]])}
    shared = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=2)
    per_output = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=2, output_noise=True)
    assert per_output.event_shapes["likelihood.noise_covar.noise"] == torch.Size([2])
    equal = condition_client(
        per_output, per_output.state({**common, "likelihood.noise_covar.noise": 0.05}), client, rows
    )
    same = condition_client(
        shared, shared.state({**common, "likelihood.noise_covar.noise": 0.05}), client, rows
    )
    assert torch.allclose(equal.mean, same.mean, rtol=1e-12) and torch.allclose(
        equal.variance_y, same.variance_y, rtol=1e-12
    )

    noise = torch.tensor([0.01, 0.2], dtype=torch.float64)
    state = per_output.state({**common, "likelihood.noise_covar.noise": noise})
    ours = condition_client(per_output, state, client, rows)
    W, v, c = state[COVAR_FACTOR], state[TASK_VAR], state["mean_module.constant"]
    B = W @ W.T + torch.diag(v)
    rbf = gpytorch.kernels.RBFKernel().double()
    rbf.lengthscale = 0.3

    def K(A, C):
        return rbf(A[:, :1], C[:, :1]).to_dense().detach() * B[A[:, 1].long()][:, C[:, 1].long()]

    R, t = client.X, client.X[:, 1].long()
    noisy = K(R, R) + torch.diag(noise[t])
    cross = K(rows, R)
    mean = c[rows[:, 1].long()] + cross @ torch.linalg.solve(noisy, client.y - c[t])
    var = K(rows, rows).diagonal() - (cross * torch.linalg.solve(noisy, cross.T).T).sum(1)
    assert torch.allclose(ours.mean, mean, rtol=1e-6, atol=1e-7)
    assert torch.allclose(ours.variance_y, var + noise[rows[:, 1].long()], rtol=1e-6)
    model = per_output.build()
    per_output.load(model, state)
    dense = -torch.distributions.MultivariateNormal(c[t], noisy).log_prob(client.y) / len(client.y)
    assert float(fedgp.models.minibatch_nll(model, client.X, client.y)) == pytest.approx(
        float(dense), rel=1e-7
    )

    fed = _correlated_owners()
    noisier = []
    for k, c in enumerate(fed):  # output 1 ten times noisier than output 0
        g = torch.Generator().manual_seed(50 + k)
        extra = 0.5 * torch.randn(c.n, generator=g, dtype=torch.float64) * (c.X[:, -1] == 1)
        noisier.append(ClientData(c.X, c.y + extra, id=c.id, X_test=c.X_test, y_test=c.y_test))
    learned = fedgp.fit(per_output, Federation(noisier), rounds=40, engine="sequential", seed=0).state
    levels = learned["likelihood.noise_covar.noise"]
    assert float(levels[1]) > 10 * float(levels[0])


# -- one owner: GPyTorch's own Hadamard multitask model -----------------------------------------------
class _GPyTorchHadamard(gpytorch.models.ExactGP):
    """GPyTorch's "Hadamard Multitask GP Regression" example model, as the example writes it."""

    def __init__(self, train_x, train_y, likelihood):
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.RBFKernel()
        self.task_covar_module = gpytorch.kernels.IndexKernel(num_tasks=2, rank=1)

    def forward(self, x, i):
        covar = self.covar_module(x).mul(self.task_covar_module(i))
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), covar)


def test_one_owner_equals_gpytorchs_hadamard_multitask_model():
    """The example's data and training loop (Adam, lr 0.1), then the same hyper-parameters in a
    MultiOutputSpec: fedgp's exact posterior of the one owner, and its marginal likelihood, are
    GPyTorch's to 1e-8."""
    torch.manual_seed(0)
    x1, x2 = torch.rand(50, dtype=torch.float64), torch.rand(50, dtype=torch.float64)
    y1 = torch.sin(x1 * (2 * math.pi)) + 0.2 * torch.randn(50, dtype=torch.float64)
    y2 = torch.cos(x2 * (2 * math.pi)) + 0.2 * torch.randn(50, dtype=torch.float64)
    i1, i2 = torch.zeros(50, 1, dtype=torch.long), torch.ones(50, 1, dtype=torch.long)
    train_x, train_i, train_y = torch.cat([x1, x2]), torch.cat([i1, i2]), torch.cat([y1, y2])
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = _GPyTorchHadamard((train_x, train_i), train_y, likelihood).double()
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with fedgp.models.exact_settings():
        for _ in range(30):
            optimizer.zero_grad()
            loss = -mll(model(train_x, train_i), train_y)
            loss.backward()
            optimizer.step()
        model.eval()
        test_x = torch.linspace(0, 1, 11, dtype=torch.float64)
        test_i = torch.tensor([0, 1] * 5 + [1], dtype=torch.long)[:, None]
        with torch.no_grad():
            theirs = likelihood(model(test_x, test_i))
            model.train()
            their_nll = float(-mll(model(train_x, train_i), train_y))

    spec = MultiOutputSpec(gpytorch.kernels.RBFKernel(), gpytorch.means.ConstantMean(), outputs=2, rank=1)
    state = spec.read(model)  # the same parameter names: the state is GPyTorch's trained values
    rows = torch.stack([train_x, train_i[:, 0].double()], 1)
    owner = ClientData(rows, train_y, id="owner")
    ours = condition_client(spec, state, owner, torch.stack([test_x, test_i[:, 0].double()], 1))
    assert torch.allclose(ours.mean, theirs.mean, rtol=1e-8, atol=1e-10)
    assert torch.allclose(ours.variance_y, theirs.variance, rtol=1e-8, atol=0)
    ours_model = spec.build()
    spec.load(ours_model, state)
    our_nll = float(fedgp.models.minibatch_nll(ours_model, rows, train_y))
    assert our_nll == pytest.approx(their_nll, rel=1e-8)


class _GPyTorchLCM(gpytorch.models.ExactGP):
    """GPyTorch's Kronecker multitask GP with an ``LCMKernel`` (every output at every input)."""

    def __init__(self, train_x, train_y, likelihood):
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=2)
        kernels = [gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel(nu=2.5)]
        self.covar_module = gpytorch.kernels.LCMKernel(kernels, num_tasks=2, rank=1)

    def forward(self, x):
        mean, covar = self.mean_module(x), self.covar_module(x)
        return gpytorch.distributions.MultitaskMultivariateNormal(mean, covar)


def test_lmc_equals_gpytorchs_lcm_kernel_model():
    """A list of Q kernels is the LMC Σ_q k_q B_q: on a full table (every output at every input) its
    posterior is GPyTorch's Kronecker LCMKernel model's with the same values, to 1e-8."""
    torch.manual_seed(1)
    X = torch.rand(30, 1, dtype=torch.float64)
    Y = torch.stack([torch.sin(6 * X[:, 0]), torch.cos(4 * X[:, 0])], 1)
    Y = Y + 0.1 * torch.randn(30, 2, dtype=torch.float64)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, has_task_noise=False)
    theirs = _GPyTorchLCM(X, Y, likelihood.double()).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.5 * torch.randn_like(p))
    terms = theirs.covar_module.covar_module_list
    spec = MultiOutputSpec([gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel(nu=2.5)], outputs=2)
    values = {
        "likelihood.noise_covar.noise": likelihood.noise.detach(),
        "mean_module.constant": torch.stack([m.constant.detach() for m in theirs.mean_module.base_means]),
    }
    for q, term in enumerate(terms):
        values[f"covar_module.kernels.{q}.lengthscale"] = term.data_covar_module.lengthscale.detach()
        values[f"task_covar_module.{q}.covar_factor"] = term.task_covar_module.covar_factor.detach()
        values[f"task_covar_module.{q}.var"] = term.task_covar_module.var.detach()
    state = spec.state(values)
    assert set(state) == set(values) and spec.terms == 2
    X_new = torch.linspace(0, 1, 7, dtype=torch.float64)[:, None]
    theirs.eval()
    with torch.no_grad(), fedgp.models.exact_settings():
        latent = theirs(X_new)
        noisy = likelihood(latent)
    ours = condition_client(spec, state, outputs_client(X, Y), output_rows(X_new, 2))
    assert torch.allclose(ours.mean.reshape(7, 2), latent.mean, rtol=1e-8, atol=1e-10)
    assert torch.allclose(ours.variance_f.reshape(7, 2), latent.variance, rtol=1e-8, atol=1e-12)
    assert torch.allclose(ours.variance_y.reshape(7, 2), noisy.variance, rtol=1e-8, atol=0)
    # the outputs' covariance at one input is the sum of the terms' B_q (k_q(x, x) = 1)
    B = sum(t.task_covar_module.covar_matrix.to_dense().detach() for t in terms)
    assert torch.allclose(spec.task_covariance(state), B, rtol=1e-12)


def test_lmc_fits_federated_owners():
    """A two-term LMC trains under FGPR on owners missing outputs (every term's W and v averaged) and
    predicts the lacking output better than independent outputs."""
    fed = _correlated_owners()
    kernels = [gpytorch.kernels.RBFKernel(), gpytorch.kernels.RBFKernel()]
    spec = MultiOutputSpec(kernels, outputs=2)
    result = fedgp.fit(spec, fed, rounds=40, engine="sequential", seed=0)
    assert {"task_covar_module.0.covar_factor", "task_covar_module.1.var"} <= set(result.state)
    assert float(spec.task_correlation(result.state)[0, 1]) < -0.5
    independent = fedgp.fit(MultiOutputSpec(outputs=2, rank=0), fed, rounds=40, engine="sequential", seed=0)
    lmc = [result.posterior(c.X_test, client=c.id).nll(c.y_test) for c in fed]
    alone = [independent.posterior(c.X_test, client=c.id).nll(c.y_test) for c in fed]
    assert sum(lmc) / 4 < sum(alone) / 4 - 0.5


# -- federated: owners missing outputs learn from the ones they hold ------------------------------------
def _correlated_owners(seed: int = 0, lower: float = 0.0, width: float = 1.0):
    """4 owners, 2 outputs with correlation -0.95. Owner k holds output (k % 2) on all of its inputs and
    the other output only on its left half; its test rows are the other output on its right half."""
    clients = []
    for k in range(4):
        g = torch.Generator().manual_seed(100 * seed + k)
        X = torch.rand(40, 1, generator=g, dtype=torch.float64)
        f = torch.sin(5 * X[:, 0]) + 0.5 * torch.cos(11 * X[:, 0])
        Y = torch.stack([f, -f], 1) + 0.05 * torch.randn(40, 2, generator=g, dtype=torch.float64)
        Y[:, 1] += 0.3 * torch.sin(3 * X[:, 0])  # not a copy: correlated, not identical
        lacking, right = 1 - k % 2, X[:, 0] > 0.5
        Y_train = Y.clone()
        Y_train[right, lacking] = float("nan")
        Y_test = torch.full_like(Y, float("nan"))
        Y_test[right, lacking] = Y[right, lacking]
        X = lower + width * X  # in other units: the same problem
        clients.append(outputs_client(X, Y_train, id=k, X_test=X[right], Y_test=Y_test[right]))
    return Federation(clients)


def test_federated_owners_learn_the_outputs_correlation_and_predict_what_they_lack():
    """FGPR on 4 owners, each lacking one output on half its inputs: the learned correlation is negative
    (-0.94 measured), and the test NLL on the lacking output beats one-output FGPR per output and the
    rank-0 ICM (measured mean NLL per owner: -0.07 joint, 1.83 rank 0, 1.93 one-output fits)."""
    fed = _correlated_owners()
    spec = MultiOutputSpec(outputs=2, rank=1)
    joint = fedgp.fit(spec, fed, rounds=40, engine="sequential", seed=0)
    correlation = spec.for_inputs(2).task_correlation(joint.state)
    assert float(correlation[0, 1]) < -0.5  # the right sign, and clearly so
    # Independent fits: one one-output FGPR per output, each on the owners' rows of that output.
    nll_joint, nll_alone, standard = [], [], Transforms(outcome=Standardize())
    for t in range(2):
        per_output = Federation(
            [ClientData(c.X[c.X[:, -1] == t, :-1], c.y[c.X[:, -1] == t], id=c.id) for c in fed]
        )
        # each output standardised by the federation's mean and sd, as the joint model's are
        alone = fedgp.fit(
            fedgp.GPSpec(), per_output, rounds=40, engine="sequential", seed=0, transforms=standard
        )
        for c in fed:
            asked = c.X_test[:, -1] == t
            if not bool(asked.any()):
                continue
            nll_joint.append(joint.posterior(c.X_test[asked], client=c.id).nll(c.y_test[asked]))
            nll_alone.append(alone.posterior(c.X_test[asked, :-1], client=c.id).nll(c.y_test[asked]))
    assert len(nll_joint) == 4  # every owner is tested on the output it lacks there
    assert sum(nll_joint) / 4 < sum(nll_alone) / 4 - 0.5
    # and against the same model with the outputs independent (rank 0): the correlation is what helps
    independent = fedgp.fit(MultiOutputSpec(outputs=2, rank=0), fed, rounds=40, engine="sequential", seed=0)
    nll_independent = [independent.posterior(c.X_test, client=c.id).nll(c.y_test) for c in fed]
    nll_all = [joint.posterior(c.X_test, client=c.id).nll(c.y_test) for c in fed]
    assert sum(nll_all) / 4 < sum(nll_independent) / 4 - 0.5


def test_batched_engine_runs_a_multi_output_spec_as_one_program():
    """The single-output tensor path does not read the output column: it refuses the spec (so even
    Batched(check=False) cannot compute the wrong kernel); the batched engine evaluates it with the
    Hadamard tensor path instead (no client-by-client fallback) and gives the sequential result
    (tests/engines/test_batched_multioutput.py holds the rest)."""
    spec = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=2)
    with pytest.raises(UnsupportedSpec, match="HadamardGPModel"):
        BatchedGP(spec)
    fed = _correlated_owners()
    sequential = fedgp.fit(spec, fed, rounds=3, engine="sequential", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedGPWarning)
        batched = fedgp.fit(spec, fed, rounds=3, engine="batched", seed=0)
    assert isinstance(BatchedEngine(spec, fed, 0).gp, HadamardBatchedGP)
    assert batched.state.allclose(sequential.state, rtol=1e-10)


def test_other_strategies_take_a_multi_output_spec():
    """The task covariance is a hyper-parameter like any other: IFCA clusters it, an owner may keep
    its own noise (personal), and ClientDP clips and noises the update that carries it."""
    fed, spec = _correlated_owners(), MultiOutputSpec(outputs=2)
    ifca = fedgp.fit(spec, fed, fedgp.strategies.IFCA(num_clusters=2), rounds=3, engine="sequential", seed=0)
    assert {"0/task_covar_module.covar_factor[1]", "1/task_covar_module.var[0]"} <= set(ifca.history.columns)
    personal = fedgp.strategies.FGPR(personal=("noise",))
    kept = fedgp.fit(spec, fed, personal, rounds=3, engine="sequential", seed=0)
    noise = "likelihood.noise_covar.noise"
    assert not torch.equal(kept.client_state(0)[noise], kept.state[noise])
    assert torch.equal(kept.client_state(0)[COVAR_FACTOR], kept.state[COVAR_FACTOR])
    private = fedgp.run.ClientDP(fedgp.strategies.FGPR(), epsilon=5.0, delta=1e-3)
    with pytest.raises(InputError, match="under ClientDP, whose 'auto' picks each client's own"):
        fedgp.fit(spec, fed, private, rounds=2, engine="sequential", seed=0)
    dp = fedgp.fit(
        spec, fed, private, rounds=2, engine="sequential", seed=0, transforms=Transforms(outcome=None)
    )
    assert float(dp.history["epsilon"].iloc[-1]) > 0
    assert all(bool(torch.isfinite(v).all()) for v in dp.state.values())


def _rescaled(fed: Federation, t: int, a: float, b: float) -> Federation:
    """``fed`` with output t's targets (training and test) mapped to a·y + b."""
    out = []
    for c in fed:
        y, y_test = c.y.clone(), c.y_test.clone()
        y[c.X[:, -1] == t] = a * y[c.X[:, -1] == t] + b
        y_test[c.X_test[:, -1] == t] = a * y_test[c.X_test[:, -1] == t] + b
        out.append(ClientData(c.X, y, id=c.id, X_test=c.X_test, y_test=y_test))
    return Federation(out)


def test_an_output_in_other_units_changes_nothing_but_its_units():
    """Per-output standardisation: with output 1 in units 1000× larger and shifted by 500, the fit
    learns the same state, its predictions of output 1 are a·m + b with variances a²·v, and its test
    RMSE and NLL are a× and + log a (a pooled mean and sd would let output 1 swamp output 0)."""
    fed, a, b = _correlated_owners(), 1000.0, 500.0
    spec = MultiOutputSpec(outputs=2)
    plain = fedgp.fit(spec, fed, rounds=10, engine="sequential", seed=0)
    # every message through bytes: predictions come back through the predict task's reply
    through = fedgp.engines.Sequential(loopback=True)
    scaled = fedgp.fit(spec, _rescaled(fed, 1, a, b), rounds=10, engine=through, seed=0)
    assert scaled.state.allclose(plain.state, rtol=1e-9, atol=1e-12)
    rows = output_rows(torch.linspace(0, 1, 4, dtype=torch.float64)[:, None], 2)
    p0 = plain.posterior(rows, client=1, full_cov=True)
    p1 = scaled.posterior(rows, client=1, full_cov=True)
    one = rows[:, -1] == 1
    factor = torch.where(one, a, 1.0).double()
    assert torch.allclose(p1.mean, factor * p0.mean + torch.where(one, b, 0.0), rtol=1e-9)
    assert torch.allclose(p1.variance_y, factor**2 * p0.variance_y, rtol=1e-9)
    assert torch.allclose(p1.covariance_f, factor[:, None] * p0.covariance_f * factor[None, :], rtol=1e-8)
    e0, e1 = plain.evaluate(), scaled.evaluate()
    only_output_1 = [c.id for c in fed if bool((c.X_test[:, -1] == 1).all())]
    assert only_output_1  # owners tested on output 1 alone
    for cid in only_output_1:
        r0, r1 = e0[e0.client == cid].iloc[0], e1[e1.client == cid].iloc[0]
        assert r1.rmse == pytest.approx(a * r0.rmse, rel=1e-9)
        assert r1.nll == pytest.approx(r0.nll + math.log(a), rel=1e-9)


# -- data, transforms and errors ---------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 4),
    st.lists(st.booleans(), min_size=24, max_size=24),
)
def test_long_form_keeps_every_observed_entry_once(n, T, missing):
    X = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2)
    Y = torch.arange(n * T, dtype=torch.float64).reshape(n, T) + 0.5
    mask = torch.tensor(missing[: n * T] + [False] * max(0, n * T - 24)).reshape(n, T)
    Y[mask] = float("nan")
    rows, y = long_form(X, Y)
    assert len(y) == int((~mask).sum())
    for row, value in zip(rows, y):
        t = int(row[-1])
        i = int(row[0]) // 2
        assert value == Y[i, t] and torch.equal(row[:-1], X[i])


def test_auto_transforms_standardise_each_output_and_leave_the_output_column():
    """The targets map by each output's own federated mean and sd (from summed counts and sums per
    output), the features to the unit cube, and the output column stays the integer the model reads."""
    fed = _correlated_owners(lower=-3.0, width=10.0)
    result = fedgp.fit(MultiOutputSpec(outputs=2), fed, rounds=1, engine="sequential", seed=0)
    transform = result.transform
    assert transform.per_output and not transform.y_local
    rows = torch.cat([c.X for c in fed])
    y = torch.cat([c.y for c in fed])
    for t in range(2):
        mine = y[rows[:, -1] == t]
        assert float(transform.y_offset[t]) == pytest.approx(float(mine.mean()), rel=1e-12)
        assert float(transform.y_scale[t]) == pytest.approx(float(mine.std()), rel=1e-12)
    assert float(transform.x_offset[-1]) == 0.0 and float(transform.x_scale[-1]) == 1.0
    assert float(transform.x_offset[0]) <= -3.0 and float(transform.x_scale[0]) >= 10.0
    assert "standardize each output" in result.transforms["outcome"]
    known = Transforms(inputs=Normalize(bounds=[[-1.0, 0.0], [3.0, 1.0]]), outcome=None)
    scaled = fedgp.fit(
        MultiOutputSpec(outputs=2), fed, rounds=1, engine="sequential", seed=0, transforms=known
    )
    assert scaled.transform.x_scale.tolist() == [4.0, 1.0] and scaled.transform.x_offset.tolist() == [
        -1.0,
        0.0,
    ]


def test_errors_name_the_problem():
    fed = _correlated_owners()
    with pytest.raises(InputError, match=r"Standardize\(local=True\) is not built for a MultiOutputSpec"):
        local = Transforms(outcome=Standardize(local=True))
        fedgp.fit(MultiOutputSpec(outputs=2), fed, rounds=1, transforms=local)
    # an output index out of range, named with the client and the row
    X = torch.tensor([[0.1, 0.0], [0.5, 1.0], [0.9, 2.0]], dtype=torch.float64)
    bad = Federation([ClientData(X, torch.tensor([0.0, 1.0, 2.0]), id="owner-7")])
    with pytest.raises(InputError, match=r"client 'owner-7', X: output index 2 in row 2 .* 2 outputs"):
        fedgp.fit(MultiOutputSpec(outputs=2), bad, rounds=1, engine="sequential")
    fractional = Federation([ClientData(X * torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0, 2.0]), id=3)])
    with pytest.raises(InputError, match="output index 0.5 in row 1"):
        fedgp.fit(MultiOutputSpec(outputs=2), fractional, rounds=1, engine="sequential")
    spec = MultiOutputSpec(gpytorch.kernels.RBFKernel(), outputs=2)
    with pytest.raises(InputError, match="output index -1"):
        condition(spec, spec.initial_state(), X[:2], torch.tensor([0.0, 1.0]), torch.tensor([[0.3, -1.0]]))
    # Y of the wrong shape
    with pytest.raises(InputError, match=r"client 'a': Y must have shape \(n, T\)"):
        outputs_client(torch.rand(4, 1), torch.rand(4), id="a")
    with pytest.raises(InputError, match="one row per row of Y"):
        outputs_client(torch.rand(3, 1), torch.rand(4, 2), id="a")
    with pytest.raises(InputError, match="infinite value at row 1, output 0"):
        long_form(torch.rand(2, 1), [[1.0, 2.0], [math.inf, 0.0]])
    # NaN means "missing" only in the multi-output table: a one-output client still refuses it
    with pytest.raises(InputError, match="NaN"):
        ClientData(torch.rand(3, 1), torch.tensor([1.0, float("nan"), 2.0]))
    with pytest.raises(InputError, match="outputs must be a positive int"):
        MultiOutputSpec(outputs=0)
    with pytest.raises(InputError, match="rank must be an int from 0 to outputs=2"):
        MultiOutputSpec(outputs=2, rank=3)
    with pytest.raises(InputTypeError, match="input kernel"):
        MultiOutputSpec(gpytorch.kernels.IndexKernel(num_tasks=2), outputs=2)
    with pytest.raises(InputTypeError, match="an LMC takes a non-empty list of GPyTorch kernels"):
        MultiOutputSpec([gpytorch.kernels.RBFKernel(), "rbf"], outputs=2)
    with pytest.raises(InputError, match="output index as its last column"):
        spec.check_input_dim(1, "c")
    with pytest.raises(InputError, match="ard_num_dims=3"):
        MultiOutputSpec(gpytorch.kernels.RBFKernel(ard_num_dims=3), outputs=2).check_input_dim(3, "c")


def test_combine_refuses_a_multi_output_spec():
    """(Saving one: tests/export/test_saved_multioutput.py; exporting it: test_export_multioutput.py.)"""
    result = fedgp.fit(MultiOutputSpec(outputs=2), _correlated_owners(), rounds=1, engine="sequential")
    with pytest.raises(InputError, match="combine= is built for one-output specs"):
        result.predict(result.client_data(0).X[:2], combine="rbcm")
