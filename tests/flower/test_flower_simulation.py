"""Flower's own simulation runtime (Ray backend, 3 SuperNodes) runs fedgp's ServerApp and
ClientApp to the same final state as the in-process sequential engine."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp
from tests.flower import app

if os.environ.get("CI", "").strip().lower() != "true":
    pytest.importorskip("flwr")
    pytest.importorskip("ray")


def _simulate(tmp_path, monkeypatch, strategy: str) -> fedgp.FitResult:
    """The test app (``tests/flower/app.py``) with ``strategy`` in Flower's simulation runtime,
    writing into ``tmp_path``; returns the same run on the sequential engine, and checks the state."""
    from flwr.simulation import run_simulation

    from fedgp.engines.ray import shutdown

    shutdown()  # a Ray instance of other tests would be reused with its settings
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FEDGP_FLOWER_OUT", str(tmp_path))
    monkeypatch.setenv("FEDGP_FLOWER_STRATEGY", strategy)
    # Flower's Ray backend writes this process's sys.path into os.environ["PYTHONPATH"] and never
    # restores it; monkeypatch puts the original back after the test.
    if "PYTHONPATH" in os.environ:
        monkeypatch.setenv("PYTHONPATH", os.environ["PYTHONPATH"])
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    try:
        run_simulation(
            server_app=app.serverapp,
            client_app=app.clientapp,
            num_supernodes=3,
            backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
        )
    finally:
        shutdown()
    assert (tmp_path / "state.json").exists(), "the ServerApp wrote no result: it failed"
    state = json.loads((tmp_path / "state.json").read_text())
    draws = app.federation()
    reference = fedgp.fit(
        draws.spec, draws.federation, app.strategy(strategy), engine="sequential", rounds=3, seed=5
    )
    for name, value in reference.state.items():
        torch.testing.assert_close(torch.tensor(state[name], dtype=torch.float64), value, rtol=1e-8, atol=0)
    return reference


@pytest.mark.slow
def test_flower_simulation_with_ray_backend_matches_sequential(tmp_path, monkeypatch):
    _simulate(tmp_path, monkeypatch, "fgpr")
    assert (tmp_path / "model.fedgp").exists()


@pytest.mark.slow
def test_personal_noise_in_flowers_simulation_runtime_is_the_sequential_run(tmp_path, monkeypatch):
    """``FGPR(personal=("noise",))`` in Flower's own runtime, where each node's context state
    crosses the Ray backend between messages: the same state and, in ``evaluate.csv``, each owner
    scored by its node under its own noise, as in process; no ``model.fedgp`` (the server holds no
    owner's noise)."""
    reference = _simulate(tmp_path, monkeypatch, "personal")
    assert not (tmp_path / "model.fedgp").exists()
    scored = pd.read_csv(tmp_path / "evaluate.csv")
    expected = reference.evaluate()
    assert list(scored["client"].astype(str)) == list(expected["client"].astype(str))
    for column in ("rmse", "nll"):
        np.testing.assert_allclose(scored[column], expected[column], rtol=1e-8)
