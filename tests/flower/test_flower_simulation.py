"""Flower's own simulation runtime (Ray backend, 3 SuperNodes) runs fedgp's ServerApp and
ClientApp to the same final state as the in-process sequential engine."""

import json
import os

import pytest
import torch

import fedgp
from tests.flower import app

if os.environ.get("CI", "").strip().lower() != "true":
    pytest.importorskip("flwr")
    pytest.importorskip("ray")


@pytest.mark.slow
def test_flower_simulation_with_ray_backend_matches_sequential(tmp_path, monkeypatch):
    from flwr.simulation import run_simulation

    from fedgp.engines.ray import shutdown

    shutdown()  # a Ray instance of other tests would be reused with its settings
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FEDGP_FLOWER_OUT", str(tmp_path))
    # Flower's Ray backend writes this process's sys.path into os.environ["PYTHONPATH"] and never
    # restores it; monkeypatch puts the original back after the test.
    if "PYTHONPATH" in os.environ:
        monkeypatch.setenv("PYTHONPATH", os.environ["PYTHONPATH"])
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    run_simulation(
        server_app=app.serverapp,
        client_app=app.clientapp,
        num_supernodes=3,
        backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
    )
    assert (tmp_path / "state.json").exists(), "the ServerApp wrote no result: it failed"
    state = json.loads((tmp_path / "state.json").read_text())
    draws = app.federation()
    reference = fedgp.fit(
        draws.spec, draws.federation, app.strategy("fgpr"), engine="sequential", rounds=3, seed=5
    )
    for name, value in reference.state.items():
        torch.testing.assert_close(torch.tensor(state[name], dtype=torch.float64), value, rtol=1e-8, atol=0)
    shutdown()
