"""A real Flower deployment on 127.0.0.1: TLS, authenticated SuperNodes, data that never leave.

Starts a SuperLink (TLS with a test CA, SuperNode authentication, runtime dependency installation
disabled) and three SuperNodes, each holding two data owners in its own folder, and runs the
example app (``examples/flower``) with ``flwr run``: FGPR and IFCA end where the in-process runs
end. Every message the nodes received and sent is captured (``fedgp.flower.capture_mod``) and
searched for every row of every owner's data: none is there. A node killed mid-run fails its
owners for the remaining rounds and the run finishes; a node whose key is not registered, and one
that does not trust the CA, are refused. Every process the test starts is killed, by PID.
Telemetry and update checks are off (there is no network).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp

if os.environ.get("CI", "").strip().lower() != "true":
    pytest.importorskip("flwr")
import psutil  # noqa: E402  (a dev dependency: kills the deployment's processes by PID)

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "flower"
BIN = Path(sys.executable).parent
OWNERS, PER_NODE, SEED = 6, 2, 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def owners():
    return fedgp.data.gp_federation(num_clients=OWNERS, n=24, d=1, n_test=5, seed=SEED)


class Deployment:
    """The processes of one test deployment, all killed (with their children) by ``close``."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(root / "flwr-home"),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
        }

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT)
        proc.log_path = self.root / f"{name}.log"
        self.procs.append(proc)
        return proc

    def supernode(self, i: int, partition: int, *extra: str) -> subprocess.Popen:
        root = self.root
        config = (
            f'data-path="{root / "data" / f"owner-{partition}"}" partition-id={partition} '
            f'capture-dir="{root / "capture" / f"node-{i}"}"'
        )
        return self.start(
            f"node-{i}",
            str(BIN / "flower-supernode"),
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--auth-supernode-private-key",
            str(self.keys[i][0]),
            "--node-config",
            config,
            "--port",
            str(free_port()),
            *extra,
        )

    def cli(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(
            [str(BIN / "flwr"), *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, f"flwr {' '.join(args)} failed: {out.stdout}\n{out.stderr}"
        return out.stdout

    def kill_tree(self, pid: int) -> None:
        try:
            parent = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return
        for p in [*parent.children(recursive=True), parent]:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass

    def close(self) -> None:
        for proc in self.procs:
            self.kill_tree(proc.pid)
        # SuperLink and SuperNodes detach their SuperExec and app processes: find them by our folder.
        for p in psutil.process_iter(["pid", "cmdline"]):
            if str(self.root) in " ".join(p.info["cmdline"] or []):
                self.kill_tree(p.info["pid"])
        for proc in self.procs:
            proc.wait(timeout=30)


def wait_for(predicate, timeout: float, what: str, poll: float = 1.0):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def run_app(dep: Deployment, out: Path, timeout: float = 600, **config) -> Path:
    pairs = " ".join(f"{k}={json.dumps(v)}" for k, v in {"out-dir": str(out), **config}.items())
    dep.cli("run", str(APP), "fedgp-test", "--run-config", pairs)
    wait_for(lambda: (out / "state.json").exists(), timeout, f"the ServerApp's result in {out}")
    return out


def learned(folder: Path) -> dict[str, torch.Tensor]:
    state = json.loads((folder / "state.json").read_text())
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in state.items()}


def in_process(strategy_name: str, rounds: int):
    sys.path.insert(0, str(APP))
    try:
        from fedgp_flower_example.task import spec, strategy
    finally:
        sys.path.remove(str(APP))
    return fedgp.fit(
        spec(1), owners().federation, strategy(strategy_name), engine="sequential", rounds=rounds, seed=0
    )


def start_deployment(root: Path, nodes: int = 3):
    """A SuperLink and ``nodes`` registered SuperNodes, each with two owners' files, on 127.0.0.1.
    Returns the deployment and ``run_app(out, **run_config)``. Also used by benchmarks/."""
    from fedgp.flower import save_npz_clients
    from fedgp.flower.security import make_node_key, make_tls

    root.mkdir(parents=True, exist_ok=True)
    certs = make_tls(root / "certs")
    keys = {i: make_node_key(root / "keys" / f"node-{i}") for i in range(1, nodes + 3)}
    data = owners()
    for n in range(OWNERS // PER_NODE):
        save_npz_clients(
            root / "data" / f"owner-{n}", list(data.federation)[n * PER_NODE : (n + 1) * PER_NODE]
        )
    port = free_port()
    dep = Deployment(root)
    dep.certs, dep.keys, dep.port = certs, keys, port
    try:
        dep.start(
            "superlink",
            str(BIN / "flower-superlink"),
            "--ssl-ca-certfile",
            str(certs["ca.crt"]),
            "--ssl-certfile",
            str(certs["server.pem"]),
            "--ssl-keyfile",
            str(certs["server.key"]),
            "--enable-supernode-auth",
            "--disable-runtime-dependency-installation",
            "--port",
            str(port),
        )
        home = root / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "fedgp-test"\n\n[superlink.fedgp-test]\naddress = "127.0.0.1:{port}"\n'
            f'root-certificates = "{certs["ca.crt"]}"\n'
        )
        wait_for(lambda: "Uvicorn running" in (root / "superlink.log").read_text(), 120, "the SuperLink")
        for i in [*range(1, nodes + 1), nodes + 2]:  # node nodes + 1 is never registered
            dep.cli("supernode", "register", str(keys[i][1]), "fedgp-test")
        dep.nodes = {
            i: dep.supernode(i, i - 1, "--root-certificates", str(certs["ca.crt"]))
            for i in range(1, nodes + 1)
        }
        wait_for(
            lambda: dep.cli("supernode", "list", "fedgp-test").count("online") == nodes, 180, "online nodes"
        )
    except BaseException:
        dep.close()
        raise
    return dep, lambda out, **config: run_app(dep, out, **config)


@pytest.mark.slow
def test_flower_deployment_tls_authenticated_nodes(tmp_path):
    root = tmp_path / "deployment"
    dep, _ = start_deployment(root)
    certs, nodes, data = dep.certs, dep.nodes, owners()
    supernode = dep.supernode
    try:
        # Refused: a key that was never registered, and a node that does not trust the test CA.
        stranger = supernode(
            4, 0, "--root-certificates", str(certs["ca.crt"]), "--max-retries", "1", "--max-wait-time", "15"
        )
        untrusting = supernode(5, 0, "--max-retries", "1", "--max-wait-time", "15")
        assert stranger.wait(timeout=120) != 0 and untrusting.wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in stranger.log_path.read_text()
        assert "CERTIFICATE_VERIFY_FAILED" in untrusting.log_path.read_text()
        assert dep.cli("supernode", "list", "fedgp-test").count("online") == 3

        # FGPR and IFCA end where the in-process runs end.
        for name, rounds in (("fgpr", 3), ("ifca", 2)):
            out = run_app(dep, root / f"out-{name}", strategy=name, rounds=rounds)
            reference = in_process(name, rounds)
            for key, value in reference.state.items():
                torch.testing.assert_close(learned(out)[key], value, rtol=1e-10, atol=0)
            history = pd.read_csv(out / "history.csv")
            assert (history["failed"] == 0).all()

        # No row of any owner's data in any message a node received or sent.
        captured = [p.read_bytes() for p in (root / "capture").rglob("*.bin")]
        assert len(captured) > 20 and all(captured)
        for client in data.federation:
            rows = [
                *client.X.numpy(),
                *client.y.numpy()[:, None],
                *client.X_test.numpy(),
                *client.y_test.numpy()[:, None],
            ]
            for row in rows:
                needle = np.ascontiguousarray(row, dtype="<f8").tobytes()
                assert not any(needle in blob for blob in captured), (
                    f"a row of client {client.id} left its node"
                )

        # A node lost mid-run: its owners fail the remaining rounds, the run finishes.
        out = root / "out-lost"
        pairs = {"out-dir": str(out), "strategy": "fgpr", "rounds": 4, "eval-every": 0, "timeout": 30.0}
        dep.cli(
            "run",
            str(APP),
            "fedgp-test",
            "--run-config",
            " ".join(f"{k}={json.dumps(v)}" for k, v in pairs.items()),
        )
        wait_for(lambda: (out / "progress.txt").exists(), 600, "round 1 of the last run")
        dep.kill_tree(nodes[3].pid)
        wait_for(lambda: (out / "state.json").exists(), 600, "the end of the run with a lost node")
        history = pd.read_csv(out / "history.csv")
        failures = pd.read_csv(out / "failures.csv")
        lost = set(data.federation.ids[4:6])
        assert history["failed"].iloc[0] == 0 and history["failed"].iloc[-1] == len(lost)
        assert set(failures["client"]) == lost
        assert failures["reason"].str.contains("no reply from Flower node").all()
    finally:
        dep.close()
        for proc in dep.procs:
            assert proc.poll() is not None, f"process {proc.pid} still running"
        shutil.rmtree(root / "capture", ignore_errors=True)
