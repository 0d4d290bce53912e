"""Federated BO on a real Flower deployment: a SuperLink and three SuperNodes started with the
Deployment guide's commands (TLS, node authentication, runtime dependency installation disabled;
tests/flower/test_flower_deployment.py's harness), each SuperNode an owner whose black box is a
function its node config names (``bo-objective``), imported on that node. The app is
``fedgp.bo.app`` (``bo_pyproject``). Checked on the files the ServerApp writes, not on exit codes:

* the history (each owner's values as its node reports them, the rounds, the train NLL) and the
  shared state equal the in-process ``BOLoop(FederatedBO)`` on the same owners, in the deployment's
  order, and seed, bit for bit;
* with ClientDP (noise from the seed) under secure aggregation, the same to the fixed-point
  encoding's error;
* no point a node evaluated is in any message it sent.

Every process is killed by PID; telemetry and update checks are off.
"""

from __future__ import annotations

import json
import shlex

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp
from tests.flower.test_flower_deployment import OWNERS, start_deployment, wait_for

pytest.importorskip("botorch")

RUN = {"seed": 3, "bo-rounds": 2, "bo-initial-rounds": 5, "bo-iterations": 2, "bo-raw-samples": 32,
       "bo-restarts": 2, "timeout": 120.0}  # fmt: skip


def node_extras() -> dict[str, str]:
    """Each owner's BO node config, inside the guide's double-quoted ``--node-config``."""
    from tests.flower.bo_objectives import BOUNDS

    bounds = json.dumps(BOUNDS).replace(" ", "")
    return {
        owner: (f'bo-objective=\\"tests.flower.bo_objectives:{owner.replace("-", "_")}\\" '
                f'bo-bounds=\\"{bounds}\\" bo-owner=\\"{owner}\\" bo-report=\\"y,best_observed\\"')
        for owner in OWNERS
    }  # fmt: skip


#: Client-level DP with noise drawn from the seed (``reproducible``, so that the runs compare): its
#: clipped updates are summed fields, which secure aggregation masks (FGPR alone sends none).
PRIVACY = json.dumps({"noise": 0.5, "clip": 5.0, "delta": 0.01, "reproducible": True}, separators=(",", ":"))


def reference(order: list[str], **extra):
    """The in-process loop, the owners in the deployment's order."""
    from fedgp.bo import BOLoop, Owner
    from fedgp.bo.app import bo_settings, method
    from tests.flower import bo_objectives

    settings, bo = bo_settings({**RUN, **extra})
    owners = [Owner(o, getattr(bo_objectives, o.replace("-", "_")), bo_objectives.BOUNDS) for o in order]
    return BOLoop(owners, method(settings, bo, 2), bo["bo-iterations"], initial=bo["bo-initial"],
                  seed=settings["seed"]).run()  # fmt: skip


@pytest.mark.slow
def test_federated_bo_on_a_deployment_equals_the_in_process_loop(tmp_path, monkeypatch):
    from fedgp.bo.app import bo_pyproject
    from fedgp.flower.fast import DEFAULT_PRELOAD

    monkeypatch.setenv("FEDGP_FLOWER_PRELOAD", f"{DEFAULT_PRELOAD},botorch,fedgp.bo.app")
    root = tmp_path / "bo"
    dep, _ = start_deployment(root, node_config=node_extras())
    try:
        (root / "fedgp-bo-app").mkdir()
        (root / "fedgp-bo-app" / "pyproject.toml").write_text(bo_pyproject())

        def run(out, **extra):
            # Strings as TOML literal strings (JSON's quotes need no escape); the whole quoted for bash.
            pairs = " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={json.dumps(v)}"
                             for k, v in {**RUN, "out-dir": str(out), **extra}.items())  # fmt: skip
            dep.bash(f"flwr run fedgp-bo-app fedgp --run-config {shlex.quote(pairs)}")
            wait_for(lambda: (out / "model.fedgp").exists() or (out / "error.txt").exists(), 900,
                     f"the BO run's model in {out}", poll=0.2)  # fmt: skip
            assert not (out / "error.txt").exists(), (out / "error.txt").read_text()
            return pd.read_csv(out / "bo-history.csv"), fedgp.load(out / "model.fedgp")

        history, model = run(root / "plain")
        order = list(history.loc[history["iteration"] == 0, "owner"])
        assert sorted(order) == sorted(OWNERS)
        local = reference(order)
        columns = ["iteration", "owner", "evaluations", "y", "best_observed", "round", "train_nll"]
        pd.testing.assert_frame_equal(history[columns], local.history[columns], check_exact=True)
        for key, value in local.method.result.state.items():
            assert torch.equal(model.state[key], value), key
        assert len(pd.read_csv(root / "plain" / "bo-failures.csv")) == 0

        # Secure aggregation of ClientDP's clipped updates: to the fixed-point encoding's error
        # (measured on the in-memory grid: state 3.1e-11 relative, proposals equal).
        history, model = run(root / "secure", **{"secure-aggregation": "{}", "privacy": PRIVACY})
        private = reference(order, privacy=PRIVACY)
        assert list(history["owner"]) == list(private.history["owner"])
        assert history["epsilon"].tolist() == private.history["epsilon"].tolist()
        np.testing.assert_allclose(history["y"], private.history["y"], rtol=0, atol=1e-6)
        for key, value in private.method.result.state.items():
            torch.testing.assert_close(model.state[key], value, rtol=1e-9, atol=0)
        for owner in OWNERS:  # every round's updates went through the protocol, on every node
            steps = list((root / "capture" / owner).glob("*-query.secagg-*-in.bin"))
            assert len(steps) >= 4 * 9, f"{owner}: {len(steps)} secure-aggregation steps for 9 rounds"

        # No point an owner evaluated, in any message its node sent (each node's own rows).
        for owner in local.owners:
            sent = [p.read_bytes() for p in (root / "capture" / owner.id).glob("*-out.bin")]
            assert len(sent) > 10, owner.id
            for row in owner.X:
                needle = np.ascontiguousarray(row.numpy(), dtype="<f8").tobytes()
                assert not any(needle in blob for blob in sent), f"a point of {owner.id} left its node"
    finally:
        dep.close()
