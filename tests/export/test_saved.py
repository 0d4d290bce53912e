"""Save/load: every spec and strategy comes back predicting the same; a crafted file runs no code."""

import json

import gpytorch
import pandas as pd
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import fedgp
from fedgp.data import ClientData, gaussian_mixed_regression
from fedgp.export.spec_io import build_spec, check_round_trip, describe_spec
from fedgp.models import ZeroKernel
from fedgp.strategies import FGPR, IFCA, FederatedClustering, MomentumClustering, MyopicClustering
from fedgp.strategies import clustered as C

K = gpytorch.kernels
NOISE = "likelihood.noise_covar.noise"


def _federation(d=2, clients=4, n=20, seed=0, linear=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(clients):
        X = torch.rand(n, d, generator=g, dtype=torch.float64)
        f = X @ torch.linspace(1, -1, d, dtype=torch.float64) if linear else torch.sin(5 * X).sum(-1)
        out.append(
            ClientData(X, (-1) ** i * f + 0.1 * torch.randn(n, generator=g, dtype=torch.float64), id=f"c{i}")
        )
    return fedgp.data.Federation(out)


SPECS = {
    "default": lambda: fedgp.GPSpec(),
    "matern_ard": lambda: fedgp.GPSpec(K.ScaleKernel(K.MaternKernel(nu=1.5, ard_num_dims=2))),
    "linear_mean": lambda: fedgp.GPSpec(mean=gpytorch.means.LinearMean(2)),
    "sum_priors_active_dims": lambda: fedgp.GPSpec(
        K.ScaleKernel(K.RBFKernel(active_dims=(0,), lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 6.0)))
        + K.ScaleKernel(K.PeriodicKernel(active_dims=(1,)))
        + K.LinearKernel(variance_constraint=gpytorch.constraints.Interval(1e-3, 4.0)),
        gpytorch.means.ConstantMean(constant_prior=gpytorch.priors.NormalPrior(0.0, 2.0)),
        gpytorch.likelihoods.GaussianLikelihood(
            noise_prior=gpytorch.priors.LogNormalPrior(-2.0, 1.0),
            noise_constraint=gpytorch.constraints.GreaterThan(1e-6),
        ),
        initial_values={NOISE: 0.3},
        fixed=["covar_module.kernels.1.base_kernel.period_length"],
    ),
}


@pytest.mark.parametrize("name", SPECS)
def test_spec_description_round_trips(name):
    spec = SPECS[name]()
    desc = check_round_trip(spec)
    rebuilt = build_spec(json.loads(json.dumps(desc)), dict(spec.initial_state()))
    assert describe_spec(rebuilt) == desc
    assert rebuilt.names == spec.names and rebuilt.trainable_names == spec.trainable_names
    assert rebuilt.initial_state().allclose(spec.initial_state(), rtol=0)
    # The same log-likelihood and prior terms on the same data: nothing but the description moved.
    X = torch.rand(9, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(4 * X).sum(-1)
    losses = []
    for s in (spec, rebuilt):
        model = s.build()
        model.train()
        model.set_train_data(X, y, strict=False)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        losses.append(mll(model(X), y))
    assert torch.equal(losses[0], losses[1])


def test_unsupported_modules_are_refused_on_save():
    class MyRBF(K.RBFKernel):
        pass

    with pytest.raises(TypeError, match="MyRBF kernel; kernels allowed in a saved spec: AdditiveKernel"):
        describe_spec(fedgp.GPSpec(K.ScaleKernel(MyRBF())))
    odd = K.RBFKernel(
        lengthscale_constraint=gpytorch.constraints.Positive(transform=torch.exp, inv_transform=torch.log)
    )
    with pytest.raises(TypeError, match="settings the saved description does not capture"):
        check_round_trip(fedgp.GPSpec(odd))


def _strategies():
    mr = gaussian_mixed_regression(k=2, d=2, sizes=[12] * 8, noise=0.1, labels="balanced", seed=3)
    linear = fedgp.GPSpec(
        ZeroKernel(), gpytorch.means.LinearMean(2, bias=False), initial_values={NOISE: 0.05}, fixed=[NOISE]
    )
    gp_fed = _federation()
    return {
        "fgpr": (fedgp.GPSpec(), gp_fed, FGPR(local_steps=2, batch_size=8), 3),
        "ifca": (linear, mr.federation, IFCA(num_clusters=2, local_steps=2, lr=0.1), 3),
        "two_phase": (
            linear,
            mr.federation,
            C.two_phase(2, lr=0.1, phase1=fedgp.strategies.MomentDescentInit(num_anchors=3, iterations=2)),
            None,
        ),
        "federated_clustering": (linear, mr.federation, FederatedClustering(lr=0.05), 3),
        "momentum_clustering": (
            linear,
            mr.federation,
            MomentumClustering(lr=0.1, num_clusters=2, alpha=0.5),
            3,
        ),
        "myopic_clustering": (linear, mr.federation, MyopicClustering(lr=0.1, num_clusters=2), 3),
    }


@pytest.mark.parametrize("name", list(_strategies()))
def test_every_strategy_round_trips(name, tmp_path):
    spec, fed, strategy, rounds = _strategies()[name]
    rounds = rounds or strategy.init_rounds + 2
    result = fedgp.fit(spec, fed, strategy, rounds=rounds, progress=False, eval_every=0)
    path = result.save(tmp_path / f"{name}.safetensors")
    loaded = fedgp.load(path)
    assert loaded.strategy == result.strategy and loaded.seed == result.seed
    assert loaded.transform.key() == result.transform.key() and loaded.transforms == result.transforms
    assert loaded.state.allclose(result.state, rtol=0)
    pd.testing.assert_frame_equal(loaded.history, result.history)
    assert loaded.registry.ids == result.registry.ids
    assert torch.equal(loaded.registry.sizes, result.registry.sizes)
    # A client the server never saw: the same prediction from the live and the loaded result.
    new = ClientData(fed[1].X[:7], fed[1].y[:7], id="newcomer")
    X = fed[0].X[:5]
    live, back = result.posterior(X, new, full_cov=True), loaded.posterior(X, new, full_cov=True)
    assert torch.equal(live.mean, back.mean) and torch.equal(live.covariance_f, back.covariance_f)
    # No client data in the file: none of the clients' targets appear among its tensors.
    with safe_open(str(path), framework="pt") as f:
        stored = torch.cat([f.get_tensor(k).to(torch.float64).reshape(-1) for k in f.keys()])
    assert not any(torch.isin(c.y, stored).any() for c in fed)


def test_loaded_result_refuses_positions_and_evaluation(tmp_path):
    spec, fed, strategy, rounds = _strategies()["fgpr"]
    loaded = fedgp.load(fedgp.fit(spec, fed, strategy, rounds=1, progress=False).save(tmp_path / "r.st"))
    with pytest.raises(
        ValueError, match="client 2: this result was loaded from a file and holds no client data"
    ):
        loaded.predict(fed[0].X, 2)
    with pytest.raises(ValueError, match="no client data to evaluate"):
        loaded.evaluate()


def _tamper(path, out, edit):
    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["fedgp"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(header)
    save_file(tensors, out, metadata={"fedgp": json.dumps(header)})
    return out


def test_crafted_files_cannot_name_other_classes(tmp_path):
    spec, fed, strategy, _ = _strategies()["fgpr"]
    path = fedgp.fit(spec, fed, strategy, rounds=1, progress=False).save(tmp_path / "r.st")

    def kernel(h):
        h["spec"]["kernel"]["base_kernel"]["class"] = "os.system"

    def prior(h):
        h["spec"]["kernel"]["base_kernel"]["lengthscale_prior"] = {"class": "builtins.eval", "loc": 0}

    def strategy_type(h):
        h["strategy"]["type"] = "subprocess:Popen"

    def state_type(h):
        h["server_state"] = {"__dataclass__": "subprocess:Popen", "fields": {"args": "touch /tmp/pwned"}}

    cases = [
        (
            kernel,
            "kernel class 'os.system', which is not on the allow-list; kernels allowed in a saved spec: Add",
        ),
        (prior, "prior class 'builtins.eval', which is not on the allow-list"),
        (strategy_type, "unknown type 'subprocess:Popen'"),
        (state_type, "'subprocess:Popen', which is not an imported fedgp dataclass"),
    ]
    for edit, message in cases:
        with pytest.raises(ValueError, match=message):
            fedgp.load(_tamper(path, tmp_path / "bad.st", edit))
    (tmp_path / "pickle.st").write_bytes(b"\x80\x04\x95not a safetensors file")
    with pytest.raises(ValueError, match="is not a safetensors file"):
        fedgp.load(tmp_path / "pickle.st")


def test_a_fresh_process_loads_a_state_saved_mid_initialisation(tmp_path):
    """State types are rebuilt without importing anything: building the strategy imports them."""
    import subprocess
    import sys

    spec, fed, strategy, _ = _strategies()["two_phase"]
    result = fedgp.fit(spec, fed, strategy, rounds=1, progress=False, eval_every=0)
    assert type(result.server_state.init).__name__ == "MomentDescentProgress"
    path = result.save(tmp_path / "mid_init.safetensors")
    code = f"import fedgp; print(type(fedgp.load({str(path)!r}).server_state.init).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "MomentDescentProgress"
