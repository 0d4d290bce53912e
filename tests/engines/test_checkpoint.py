"""Checkpoints are safe to read, detect damage, and refuse to resume a different run."""

import os
import pickle

import gpytorch
import pytest
import torch

import fedgp
from fedgp.errors import CheckpointError
from fedgp.run import checkpoint as ckpt_module
from fedgp.run.checkpoint import FORMAT_VERSION, Checkpoint, load_checkpoint, save_checkpoint
from fedgp.strategies import FGPR
from fedgp.strategies.clustered import presets as C
from fedgp.synthetic import gp_federation


@pytest.fixture(scope="module")
def draws():
    return gp_federation(num_clients=4, n=[20, 25, 30, 35], d=1, seed=2)


@pytest.fixture(scope="module")
def written(draws, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "run.ckpt"
    fedgp.fit(
        draws.spec,
        draws.federation,
        FGPR(local_steps=2),
        engine="sequential",
        rounds=2,
        callbacks=[fedgp.run.Checkpointing(path, every=1)],
    )
    return path


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_CHECKPOINT",))


def test_old_pickle_checkpoints_are_refused_unread(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, writer in [("zip.ckpt", lambda p: torch.save({"x": _Boom()}, p)),
                         ("raw.ckpt", lambda p: p.write_bytes(pickle.dumps(_Boom())))]:  # fmt: skip
        path = tmp_path / name
        writer(path)
        with pytest.raises(
            CheckpointError,
            match=r"format 1 \(a torch.save pickle\)\. It is refused unread: unpickling a file can run",
        ):
            load_checkpoint(path)
    assert not (tmp_path / "PWNED_BY_CHECKPOINT").exists()


def test_every_flipped_byte_and_every_truncation_is_a_clear_error(written, tmp_path):
    data = written.read_bytes()
    assert load_checkpoint(written).completed_rounds == 2
    positions = sorted({int(i * (len(data) - 1) / 59) for i in range(60)})
    bad = tmp_path / "bad.ckpt"
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match="damaged|not a sealed fedgp file"):
            load_checkpoint(bad)
    for cut in (0, 10, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="damaged|not a sealed fedgp file"):
            load_checkpoint(bad)


def test_a_valid_checksum_does_not_let_a_file_name_arbitrary_types(tmp_path):
    """A forged file sealed with a correct checksum, naming ``os:system`` as a type, is refused."""
    import hashlib

    from fedgp.messages.container import pack

    forged_state = {"type": "os:system", "params": {"command": "touch PWNED"}}
    header = {
        "completed_rounds": 0,
        "server_state": forged_state,
        "history": [],
        "failures": [],
        "callbacks": {"__dict__": {}},
        "fingerprint": {},
    }
    payload = pack("checkpoint", FORMAT_VERSION, header, {})
    path = tmp_path / "forged.ckpt"
    path.write_bytes(b"FEDGP sha256=" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    with pytest.raises(CheckpointError, match="'os:system' is not a registered or imported fedgp dataclass"):
        load_checkpoint(path)


def test_checkpoints_of_format_2_are_refused_naming_the_format(tmp_path):
    """The previous layout (safetensors metadata behind ``FEDGP-CHECKPOINT 2``), even well sealed."""
    import hashlib
    import json

    from safetensors.torch import save

    manifest = {"version": 2, "completed_rounds": 0, "history": [], "fingerprint": {}, "server_state": {}}
    payload = save({}, metadata={"fedgp": json.dumps(manifest)})
    path = tmp_path / "old.ckpt"
    path.write_bytes(
        b"FEDGP-CHECKPOINT 2 sha256=" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    )
    with pytest.raises(CheckpointError, match=rf"format 2; this fedgp reads format {FORMAT_VERSION}"):
        load_checkpoint(path)


def test_server_states_of_every_kind_round_trip_exactly(tmp_path):
    from fedgp.strategies.clustered.moment_descent import MomentDescentProgress
    from fedgp.strategies.clustered.state import ClusteredState
    from fedgp.strategies.gradient_clustering.state import PersonalState

    hs = fedgp.GPSpec().initial_state().expand(2)
    states = [
        ClusteredState(hs, torch.tensor([0, -1]), torch.tensor([1.5]), init=MomentDescentProgress(
            torch.tensor([1]), torch.zeros(1, 2), torch.arange(3), k=2, trace=[torch.ones(2)]
        )),
        PersonalState(hs, torch.zeros(2, 3), torch.tensor([True, False]), torch.zeros(2, 1, dtype=torch.long),
                      centres=[torch.eye(2)]),
    ]  # fmt: skip
    history = [{"round": 1, "train_nll": float("nan"), "failures": "", "x": (1, 2.5)}]
    for state in states:
        path = tmp_path / "s.ckpt"
        save_checkpoint(path, Checkpoint(3, state, history, {"seed": "0"}))
        back = load_checkpoint(path)
        assert type(back.server_state) is type(state)
        assert repr(back.server_state) == repr(state)
        assert back.history[0]["x"] == (1, 2.5) and back.fingerprint == {"seed": "0"}


def test_write_is_fsynced_then_renamed_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    save_checkpoint(tmp_path / "a.ckpt", Checkpoint(1, {"w": torch.ones(2)}, []))
    assert calls[:2] == ["fsync", "replace"]
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "b.ckpt", Checkpoint(1, {"w": torch.ones(2)}, []))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt"]
    assert ckpt_module.load_checkpoint(tmp_path / "a.ckpt").server_state["w"].tolist() == [1.0, 1.0]


def _resume_error(draws, written, spec=None, federation=None, strategy=None, engine="sequential"):
    with pytest.raises(CheckpointError) as info:
        fedgp.fit(
            spec or draws.spec,
            federation or draws.federation,
            strategy or FGPR(local_steps=2),
            engine=engine,
            rounds=3,
            callbacks=[fedgp.run.Checkpointing(written, every=None, resume=True)],
        )
    return str(info.value)


def test_resume_names_the_field_that_differs(draws, written):
    matern = fedgp.GPSpec(gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5)))
    assert "different spec.covar_module.base_kernel (checkpoint: gpytorch.kernels.rbf_kernel.RBFKernel" in (
        _resume_error(draws, written, spec=matern)
    )
    moved = fedgp.GPSpec(initial_values={"likelihood.noise_covar.noise": 0.3})
    assert "spec.likelihood.noise_covar.raw_noise" in _resume_error(draws, written, spec=moved)
    fixed = fedgp.GPSpec(fixed=["likelihood.noise_covar.noise"])
    assert "spec.fixed (checkpoint: ; this run: likelihood.noise_covar.noise)" in _resume_error(
        draws, written, spec=fixed
    )
    bounded = fedgp.GPSpec(likelihood=gpytorch.likelihoods.GaussianLikelihood(
        noise_constraint=gpytorch.constraints.GreaterThan(1e-6)))  # fmt: skip
    assert "spec.likelihood.noise_covar.raw_noise_constraint.lower_bound" in _resume_error(
        draws, written, spec=bounded
    )
    prior = fedgp.GPSpec(likelihood=gpytorch.likelihoods.GaussianLikelihood(
        noise_prior=gpytorch.priors.GammaPrior(1.1, 0.05)))  # fmt: skip
    assert "spec.likelihood.noise_covar.noise_prior" in _resume_error(draws, written, spec=prior)
    twelve = gp_federation(num_clients=12, n=20, d=1, seed=2).federation
    assert "federation.clients (checkpoint: 4; this run: 12)" in _resume_error(
        draws, written, federation=twelve
    )
    other = gp_federation(num_clients=4, n=[20, 25, 30, 35], d=1, seed=3).federation
    message = _resume_error(draws, written, federation=other)
    assert "different federation.data" in message and "federation.sizes" not in message
    assert "different engine (checkpoint: sequential; this run: batched)" in _resume_error(
        draws, written, engine="batched"
    )
    with pytest.raises(CheckpointError, match=r"different transform.y_offset \(checkpoint: float64\[\]="):
        fedgp.fit(
            draws.spec,
            draws.federation,
            FGPR(local_steps=2),
            engine="sequential",
            rounds=3,
            transforms=fedgp.transforms.Transforms(outcome=None),
            callbacks=[fedgp.run.Checkpointing(written, every=None, resume=True)],
        )
    assert "different strategy.local_steps (checkpoint: 2; this run: 3)" in _resume_error(
        draws, written, strategy=FGPR(local_steps=3)
    )


def test_fingerprint_sees_fields_hidden_from_repr(draws):
    """``GivenInit.states`` has ``repr=False``: two strategies with equal reprs differ in config."""
    from fedgp.engines.sequential import SequentialEngine
    from fedgp.run.fingerprint import run_fingerprint

    a_states = draws.spec.initial_state().expand(2)
    b_states = draws.spec.state({"likelihood.noise_covar.noise": 0.5}).expand(2)
    a, b = C.oracle(a_states), C.oracle(b_states)
    assert repr(a) == repr(b)
    registry = SequentialEngine(draws.spec, draws.federation).start(a, 0)
    fa = run_fingerprint(draws.spec, a, registry, draws.federation, "sequential", 0, {})
    fb = run_fingerprint(draws.spec, b, registry, draws.federation, "sequential", 0, {})
    differ = [k for k in fa if fa[k] != fb[k]]
    assert differ == ["strategy.initializer.states"]
