"""Save/load: every spec and strategy comes back predicting the same; a crafted file runs no code."""

import json

import gpytorch
import pandas as pd
import pytest
import torch
from safetensors.torch import load as load_payload
from safetensors.torch import save_file

import fedgp
from fedgp.data import ClientData
from fedgp.messages.container import HEADER, pack, seal, unpack, unseal
from fedgp.models import ZeroKernel
from fedgp.models.spec_io import build_spec, check_round_trip, describe_spec
from fedgp.strategies import FGPR, IFCA, FederatedClustering, MomentumClustering, MyopicClustering
from fedgp.strategies import clustered as C
from fedgp.synthetic import gaussian_mixed_regression

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
    result = fedgp.fit(spec, fed, strategy, rounds=rounds, callbacks=[fedgp.run.Evaluate(every=0)])
    path = result.save(tmp_path / f"{name}.safetensors")
    loaded = fedgp.load(path)
    assert loaded.strategy == result.strategy and loaded.seed == result.seed
    assert loaded.transform.key() == result.transform.key() and loaded.transforms == result.transforms
    assert loaded.state.allclose(result.state, rtol=0)
    pd.testing.assert_frame_equal(loaded.history, result.history)
    assert loaded.roster.ids == result.roster.ids
    for name in ("sizes", "n_test", "dims"):
        assert torch.equal(getattr(loaded.roster, name), getattr(result.roster, name))
    # A client the server never saw: the same prediction from the live and the loaded result.
    new = ClientData(fed[1].X[:7], fed[1].y[:7], id="newcomer")
    X = fed[0].X[:5]
    live, back = result.posterior(X, new, full_cov=True), loaded.posterior(X, new, full_cov=True)
    assert torch.equal(live.mean, back.mean) and torch.equal(live.covariance_f, back.covariance_f)
    # No client data in the file: none of the clients' targets appear among its tensors or in its header.
    header, tensors = _read(path)
    stored = torch.cat([t.to(torch.float64).reshape(-1) for t in tensors.values()] + [_numbers(header)])
    assert not any(torch.isin(c.y, stored).any() for c in fed)


def test_loaded_result_refuses_positions_and_evaluation(tmp_path):
    spec, fed, strategy, rounds = _strategies()["fgpr"]
    loaded = fedgp.load(fedgp.fit(spec, fed, strategy, rounds=1).save(tmp_path / "r.st"))
    with pytest.raises(
        ValueError, match="client 2: this result was loaded from a file and holds no client data"
    ):
        loaded.predict(fed[0].X, 2)
    with pytest.raises(ValueError, match="no client data to evaluate"):
        loaded.evaluate()


def _read(path):
    """A saved result's header and tensors, read the way ``fedgp.load`` reads them (seal checked)."""
    return unpack(unseal(path.read_bytes(), str(path)), "fit-result", 4, str(path))


def _numbers(tree):
    """Every number in a JSON tree, as one float64 tensor."""
    out = []

    def walk(x):
        if isinstance(x, bool) or x is None or isinstance(x, str):
            return
        if isinstance(x, (int, float)):
            out.append(float(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(tree)
    return torch.tensor(out, dtype=torch.float64)


def _tamper(path, out, edit):
    """``path`` with its header edited inside the payload and sealed again (a valid checksum), so
    that only the crafted entry can make ``fedgp.load`` refuse it."""
    header, tensors = _read(path)
    edit(header)
    format, version = header.pop("format"), header.pop("version")
    out.write_bytes(seal(pack(format, version, header, tensors)))
    return out


def test_crafted_files_cannot_name_other_classes(tmp_path):
    spec, fed, strategy, _ = _strategies()["fgpr"]
    path = fedgp.fit(spec, fed, strategy, rounds=1).save(tmp_path / "r.st")
    pwned = tmp_path / "pwned"

    def kernel(h):
        h["spec"]["kernel"]["base_kernel"]["class"] = "os.system"

    def prior(h):
        h["spec"]["kernel"]["base_kernel"]["lengthscale_prior"] = {"class": "builtins.eval", "loc": 0}

    def strategy_type(h):
        h["strategy"]["type"] = "subprocess:Popen"
        h["strategy"]["params"] = {"args": ["touch", str(pwned)]}

    def state_type(h):
        h["server_state"] = {"type": "subprocess:Popen", "params": {"args": ["touch", str(pwned)]}}

    def state_type_nested(h):
        h["server_state"] = {"__tuple__": [{"type": "os:system", "params": {"command": f"touch {pwned}"}}]}

    untouched, _ = _read(_tamper(path, tmp_path / "same.st", lambda h: None))
    assert untouched == _read(path)[0]  # the helper alone changes nothing
    assert fedgp.load(tmp_path / "same.st").state.allclose(fedgp.load(path).state, rtol=0)
    cases = [
        (
            kernel,
            "kernel class 'os.system', which is not on the allow-list; kernels allowed in a saved spec: Add",
        ),
        (prior, "prior class 'builtins.eval', which is not on the allow-list"),
        (strategy_type, "type 'subprocess:Popen' is not a registered or imported fedgp dataclass"),
        (state_type, "type 'subprocess:Popen' is not a registered or imported fedgp dataclass"),
        (state_type_nested, "type 'os:system' is not a registered or imported fedgp dataclass"),
    ]
    for edit, message in cases:
        with pytest.raises(fedgp.FileFormatError, match=message):
            fedgp.load(_tamper(path, tmp_path / "bad.st", edit))
        assert not pwned.exists()
    (tmp_path / "pickle.st").write_bytes(b"\x80\x04\x95not a safetensors file")
    with pytest.raises(fedgp.FileFormatError, match="not a saved fedgp result"):
        fedgp.load(tmp_path / "pickle.st")


def test_damaged_and_foreign_files_are_refused(tmp_path):
    spec, fed, strategy, _ = _strategies()["fgpr"]
    path = fedgp.fit(spec, fed, strategy, rounds=1).save(tmp_path / "r.st")
    data = path.read_bytes()
    assert data.startswith(b"FEDGP sha256=") and data.index(b"\n") == len("FEDGP sha256=") + 64
    flipped = bytearray(data)
    flipped[-1] ^= 1
    (tmp_path / "flipped.st").write_bytes(bytes(flipped))
    with pytest.raises(fedgp.FileFormatError, match="is damaged: its contents have sha256"):
        fedgp.load(tmp_path / "flipped.st")
    (tmp_path / "short.st").write_bytes(data[:-10])
    with pytest.raises(fedgp.FileFormatError, match="is damaged"):
        fedgp.load(tmp_path / "short.st")
    # a sealed fedgp payload of another format or version is refused naming what it is
    header, tensors = _read(path)
    del header["format"], header["version"]
    (tmp_path / "ckpt.st").write_bytes(seal(pack("checkpoint", 3, header, tensors)))
    with pytest.raises(fedgp.FileFormatError, match="is a fedgp 'checkpoint', not a 'fit-result'"):
        fedgp.load(tmp_path / "ckpt.st")
    (tmp_path / "v6.st").write_bytes(seal(pack("fit-result", 6, header, tensors)))
    with pytest.raises(fedgp.FileFormatError, match="format version 6; this fedgp reads version 3 or 4 or 5"):
        fedgp.load(tmp_path / "v6.st")
    with pytest.raises(fedgp.MissingFileError, match="no saved result at"):
        fedgp.load(tmp_path / "absent.st")


def test_an_unsealed_result_of_format_version_2_is_refused_by_version(tmp_path):
    """What the previous fedgp wrote: a bare safetensors file, its header in the 'fedgp' metadata."""
    spec, fed, strategy, _ = _strategies()["fgpr"]
    path = fedgp.fit(spec, fed, strategy, rounds=1).save(tmp_path / "r.st")
    header, tensors = _read(path)
    header.update(format="fedgp.FitResult", version=2)
    # even one naming a class to run is refused on its version, before anything is rebuilt
    header["server_state"] = {"__dataclass__": "subprocess:Popen", "fields": {"args": "touch /tmp/pwned"}}
    assert HEADER not in tensors
    old = tmp_path / "old.safetensors"
    save_file(tensors, old, metadata={"fedgp": json.dumps(header)})
    assert load_payload(old.read_bytes()).keys() == tensors.keys()  # a plain safetensors file
    with pytest.raises(
        fedgp.FileFormatError, match=r"earlier fedgp \(format version 2\); this fedgp reads version 3 or 4"
    ):
        fedgp.load(old)


def test_a_fresh_process_loads_a_state_saved_mid_initialisation(tmp_path):
    """State types are rebuilt without importing anything: building the strategy imports them."""
    import subprocess
    import sys

    spec, fed, strategy, _ = _strategies()["two_phase"]
    result = fedgp.fit(spec, fed, strategy, rounds=1, callbacks=[fedgp.run.Evaluate(every=0)])
    assert type(result.server_state.init).__name__ == "MomentDescentProgress"
    path = result.save(tmp_path / "mid_init.safetensors")
    code = f"import fedgp; print(type(fedgp.load({str(path)!r}).server_state.init).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "MomentDescentProgress"
