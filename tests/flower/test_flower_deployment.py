"""A real Flower deployment, run with the commands of the Deployment guide (docs/guides/deployment.md).

The test reads the guide's bash blocks and runs them in order, as a user would, with the SuperLink
bound to 127.0.0.2 (not Flower's default 127.0.0.1, so a bind flag that is ignored fails the test)
and three SuperNodes on this host, each reading one owner's 3-feature CSV table: TLS with a test
CA, SuperNode authentication, runtime dependency installation disabled. Only the values a test
must own are changed: the addresses and ports (free ones), a short run, and each node's
``capture-dir``. Then:

* the saved model the ServerApp wrote predicts, through ``fedgp predict`` as the guide says and
  through ``fedgp.load``, what the same run in process predicts (to 1e-8);
* every message the nodes received and sent is searched for every row of every owner: none is there;
* an unregistered SuperNode and one that does not trust the CA are refused;
* with ``secure-aggregation``, no node's own summed value is in anything it sends, and the model is
  the in-process run's;
* a node killed mid-run (secure aggregation and client-level DP on) fails its owner for the
  remaining rounds, and the run finishes;
* ``fedgp flower status`` (section 5) says the run finished; a run whose run config names an owner
  column the tables lack leaves ``error.txt`` in its ``out-dir`` (one line naming the run-config
  key), and the status says it failed, with exit status 1;
* section 5's client-level DP with secure aggregation at rate 0.5 runs on the three nodes: the
  round that drew one node is skipped and accounted, and the run finishes.
* on three nodes of which one waits 4 s before each training task (node config ``train-delay``), an
  asynchronous FGPR run measured as replies arrive steps without waiting for it.

Every process the test starts is killed, by PID (the guide's ``&`` processes are found by their
working folder). Telemetry and update checks are off (there is no network).
"""

from __future__ import annotations

import json
import os
import re
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
GUIDE = REPO / "docs" / "guides" / "deployment.md"
BIN = Path(sys.executable).parent
OWNERS = ("plant-a", "plant-b", "plant-c")
LINK = "127.0.0.2"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def guide_blocks() -> list[str]:
    """The guide's bash blocks, in order."""
    return re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)


def owner_tables(folder: Path, seed: int = 11) -> dict[str, pd.DataFrame]:
    """One table per owner: 40 rows of 3 features; owners differ in level."""
    rng = np.random.default_rng(seed)
    tables = {}
    for i, owner in enumerate(OWNERS):
        X = rng.uniform(-1, 1, size=(40, 3))
        y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - 0.3 * X[:, 2] + 0.3 * i + 0.05 * rng.normal(size=40)
        tables[owner] = pd.DataFrame({"owner": owner, "x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "y": y})
        tables[owner].to_csv(folder / f"{owner}.csv", index=False)
    return tables


class Deployment:
    """The guide's commands, run in ``root``; ``close`` kills every process they started."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.port = free_port(LINK)
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        self.env.pop("FEDGP_DATA", None)
        blocks = guide_blocks()
        # Block 0 sets the shell's variables: the SuperLink's address and port become the test's.
        self.prelude = (
            blocks[0]
            .replace("export LINK=10.0.0.5", f"export LINK={LINK}")
            .replace("export LINK_PORT=9093", f"export LINK_PORT={self.port}")
        )
        assert f"LINK={LINK}" in self.prelude and f"LINK_PORT={self.port}" in self.prelude, blocks[0]
        self.blocks = blocks[1:]

    def bash(self, script: str, timeout: float = 300) -> str:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{self.prelude}\n{script}"], cwd=self.root,
                              env=self.env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
        assert done.returncode == 0, f"{script}\nfailed: {done.stdout}\n{done.stderr}"
        return done.stdout

    def block(self, title: str) -> str:
        """The guide's block whose first command starts with ``title``."""
        found = [b for b in self.blocks if b.lstrip().startswith(title)]
        assert len(found) == 1, f"the guide has no single block starting {title!r}"
        return found[0]

    def ours(self) -> list[psutil.Process]:
        """Every process started in the deployment's folder (the guide's ``&`` ones and theirs)."""
        found = []
        for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
            try:
                if p.info["cwd"] == str(self.root) or str(self.root) in " ".join(p.info["cmdline"] or []):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return [p for p in found if p.pid != os.getpid()]

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

    def node(self, owner: str) -> psutil.Process:
        # The command lines process_iter read: a ClientApp that exits meanwhile is a zombie, whose
        # cmdline() raises psutil.ZombieProcess (seen at 0656142).
        found = [p for p in self.ours() if f"keys/{owner}" in " ".join(p.info["cmdline"] or [])]
        assert len(found) == 1, f"SuperNode of {owner}: {found}"
        return found[0]

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, env={**self.env, "FLWR_HOME": str(self.root / "flwr-home")},
                                cwd=self.root, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        proc.log_path = self.root / f"{name}.log"
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            self.kill_tree(proc.pid)
        for p in self.ours():
            self.kill_tree(p.pid)
        for proc in self.procs:
            proc.wait(timeout=30)
        # The guide's `&` processes are not our children: wait for them to be gone after SIGKILL.
        _, alive = psutil.wait_procs(self.ours(), timeout=30)
        assert not alive, f"processes left running: {alive}"


def rounds_done(out: Path) -> int:
    """The rounds a run into ``out`` has completed, by its ``progress.txt`` (0 before it exists)."""
    try:
        return int((out / "progress.txt").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def wait_for(predicate, timeout: float, what: str, poll: float = 1.0):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def start_deployment(
    root: Path, capture: bool = True, stock: bool = False, node_config: dict[str, str] | None = None
) -> tuple[Deployment, callable]:
    """Sections 1 to 4 of the guide: credentials, app, SuperLink, keys, three SuperNodes (Flower's
    own ``flower-supernode`` with ``stock``, else ``fedgp flower supernode`` as the guide says);
    ``node_config`` adds settings to an owner's node config (``{"plant-c": "train-delay=2"}``).
    Returns the deployment and ``run(out, **run_config)`` (section 5, waiting for the model).
    Also used by benchmarks/engine_overhead.py."""
    root.mkdir(parents=True, exist_ok=True)
    owner_tables(root)
    dep = Deployment(root)
    try:
        dep.bash(dep.block("python -m fedgp.flower.security tls"))
        superlink = dep.block("flower-superlink")
        assert '--host "$LINK"' in superlink
        dep.bash(superlink)
        wait_for(lambda: "Uvicorn running" in (root / "superlink.log").read_text(), 120, "the SuperLink")
        dep.bash(dep.block('mkdir -p "$FLWR_HOME"'))
        nodes = dep.block("fedgp flower supernode")
        if stock:
            nodes = nodes.replace("fedgp flower supernode", "flower-supernode")
        for port in re.findall(r"--port (\d+)", nodes):  # free local ports, one per SuperNode
            nodes = nodes.replace(f"--port {port}", f"--port {free_port()}")
        if capture:
            for owner in OWNERS:
                nodes = nodes.replace(
                    f'{owner}.csv\\"', f'{owner}.csv\\" capture-dir=\\"$PWD/capture/{owner}\\"'
                )
            assert nodes.count("capture-dir") == len(OWNERS)
        for owner, extra in (node_config or {}).items():
            nodes = nodes.replace(f'{owner}.csv\\"', f'{owner}.csv\\" {extra}')
            assert extra in nodes, owner
        dep.bash(nodes)
        wait_for(
            lambda: dep.bash("flwr supernode list fedgp").count("online") == len(OWNERS), 180, "online nodes"
        )
    except BaseException:
        dep.close()
        raise
    run_block = dep.block("flwr supernode list fedgp")
    assert 'flwr run fedgp-app fedgp --run-config "rounds=20 out-dir=\\"$PWD/model\\""' in run_block

    def run(out: Path, timeout: float = 600, **config) -> Path:
        pairs = " ".join(f"{k}={json.dumps(v)}" for k, v in {"out-dir": str(out), **config}.items())
        dep.bash(f"flwr run fedgp-app fedgp --run-config '{pairs}'")
        wait_for(
            lambda: (out / "model.fedgp").exists(), timeout, f"the ServerApp's model in {out}", poll=0.05
        )
        return out

    return dep, run


def in_process(config: dict, order: list[str], tables: dict[str, pd.DataFrame]):
    """The same run in this process: the owners in the deployment's order, the app's settings."""
    from fedgp.data import ClientData, Federation
    from fedgp.flower.app import AppSettings

    settings = AppSettings(config)
    clients = [
        ClientData(tables[o][["x1", "x2", "x3"]].to_numpy(), tables[o]["y"].to_numpy(), id=o) for o in order
    ]
    return fedgp.fit(settings.spec(3), Federation(clients), settings.strategy(), engine="sequential",
                     **settings.fit_options())  # fmt: skip


@pytest.mark.slow
def test_the_deployment_guide_runs_as_written_and_its_model_predicts(tmp_path):
    root = tmp_path / "deployment"
    dep, run = start_deployment(root)
    tables = owner_tables(root)
    try:
        # Refused: a key that was never registered, and a node that does not trust the test CA.
        from fedgp.flower.security import make_node_key

        stranger_key, _ = make_node_key(root / "keys" / "stranger")
        common = ["--superlink", f"{LINK}:{dep.port}", "--max-retries", "1", "--max-wait-time", "15",
                  "--node-config", f'data-path="{root / "plant-a.csv"}"']  # fmt: skip
        stranger = dep.start("stranger", str(BIN / "flower-supernode"), *common, "--root-certificates",
                             "certificates/ca.crt", "--auth-supernode-private-key", str(stranger_key),
                             "--port", str(free_port()))  # fmt: skip
        untrusting = dep.start("untrusting", str(BIN / "flower-supernode"), *common,
                               "--auth-supernode-private-key", "keys/plant-a",
                               "--port", str(free_port()))  # fmt: skip
        assert stranger.wait(timeout=120) != 0 and untrusting.wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in stranger.log_path.read_text()
        assert "CERTIFICATE_VERIFY_FAILED" in untrusting.log_path.read_text()

        # Section 5, shortened: the model the ServerApp wrote is the in-process run's.
        config = {"rounds": 3, "stop": "none"}
        out = run(root / "model", **config)
        model = fedgp.load(out / "model.fedgp")
        assert sorted(model.roster.ids) == sorted(OWNERS)
        assert json.loads((out / "columns.json").read_text())["features"] == ["x1", "x2", "x3"]
        reference = in_process(config, list(model.roster.ids), tables)
        for key, value in reference.state.items():
            torch.testing.assert_close(model.state[key], value, rtol=1e-10, atol=0)
        assert (pd.read_csv(out / "history.csv")["failed"] == 0).all()

        # Section 6 as written: plant-a predicts from the deployment's model with its own rows.
        pd.DataFrame({"owner": ["plant-a"] * 4, "x1": [0.1, -0.5, 0.9, 0.0], "x2": [0.2, 0.2, -0.7, 0.0],
                      "x3": [-0.3, 0.6, 0.1, 0.0]}).to_csv(root / "new-rows.csv", index=False)  # fmt: skip
        dep.bash(dep.block("fedgp predict"))
        pred = pd.read_csv(root / "predictions" / "predictions.csv")
        a = [c for c in reference.federation if c.id == "plant-a"][0]
        mean, var = reference.predict(
            torch.tensor(pred[["x1", "x2", "x3"]].to_numpy()), a, observation_noise=True
        )
        np.testing.assert_allclose(pred["mean"], mean.numpy(), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(pred["sd"] ** 2, var.numpy(), rtol=1e-8, atol=1e-12)

        # flwr log shows fedgp's round lines.
        runs = dep.bash("flwr ls fedgp --format json")
        run_id = json.loads(runs[runs.index("{") :])["runs"][0]["run-id"]
        log = subprocess.run([str(BIN / "flwr"), "log", str(run_id), "fedgp", "--show"], cwd=root,
                             env={**dep.env, "FLWR_HOME": str(root / "flwr-home")}, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert "fedgp round 3/3: 3 participants, 3 replies, 0 failed" in log.stdout + log.stderr

        # No row of any owner's data in any message a node received or sent.
        captured = [p.read_bytes() for p in (root / "capture").rglob("*.bin")]
        assert len(captured) > 20 and all(captured)
        for owner, table in tables.items():
            for row in [*table[["x1", "x2", "x3"]].to_numpy(), *table[["y"]].to_numpy()]:
                needle = np.ascontiguousarray(row, dtype="<f8").tobytes()
                assert not any(needle in blob for blob in captured), f"a row of {owner} left its node"

        # Secure aggregation: the transforms' summary reaches the server only as the three nodes' sum.
        # Each node's own Σy is in what it sent above (the search works) and nowhere in what it sends
        # now, as a float or in fixed point; the model is the in-process run's, to the encoding's error.
        before = set((root / "capture").rglob("*.bin"))
        secure = {"rounds": 2, "stop": "none", "secure-aggregation": "{}"}
        model = fedgp.load(run(root / "secure", **secure) / "model.fedgp")
        reference = in_process({"rounds": 2, "stop": "none"}, list(model.roster.ids), tables)
        for key, value in reference.state.items():
            torch.testing.assert_close(model.state[key], value, rtol=1e-7, atol=0)
        from fedgp.flower import SecureAggregation

        bits = SecureAggregation().fraction_bits
        for owner in OWNERS:
            sent = [p.read_bytes() for p in (root / "capture" / owner).glob("*-out.bin")]
            new = [p.read_bytes() for p in (root / "capture" / owner).glob("*-out.bin") if p not in before]
            assert len(new) >= 4 * 2 + 3, f"{owner}: {len(new)} messages out in a secure 2-round run"
            y_sum = float(torch.tensor(pd.read_csv(root / f"{owner}.csv")["y"].to_numpy()).sum())
            assert any(np.float64(y_sum).tobytes() in blob for blob in sent), (
                f"{owner}: the control finds nothing"
            )
            for needle in (np.float64(y_sum).tobytes(), np.int64(round(y_sum * 2.0**bits)).tobytes()):
                assert not any(needle in blob for blob in new), f"{owner}'s own Σy left its node"

        # Section 5's status block: the run above finished.
        status = dep.bash(dep.block("fedgp flower status"))
        assert status.startswith("finished: 3 round(s), model.fedgp written "), status

        # A run that fails fails loudly: the owner column the run config names is not in the tables.
        # flwr run exits 0 all the same; out-dir/error.txt says why on one line, naming the run-config
        # key, and fedgp flower status prints it with exit status 1.
        failed = root / "failed"
        dep.bash(f"flwr run fedgp-app fedgp --run-config \"out-dir='{failed}' group='plant'\"")
        wait_for(lambda: (failed / "error.txt").exists(), 300, "the failed run's error.txt", poll=0.1)
        error = (failed / "error.txt").read_text()
        assert error.count("\n") == 1 and error.startswith("EngineError: no Flower node registered: "), error
        assert error.count("no column 'plant' (run config 'group')") == len(OWNERS), error
        state = subprocess.run([str(BIN / "fedgp"), "flower", "status", str(failed)], cwd=root, env=dep.env,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert state.returncode == 1 and state.stdout == f"failed: {error}", state

        # Section 5's client-level DP with secure aggregation, as written but for the round budget: at
        # rate 0.5 on three nodes (the seed's draws: 0, 3, 2, 1, 2 owners) round 4 drew one node, whose
        # sum secure aggregation does not release. It is skipped and accounted; the run finishes.
        recipe = dep.block('flwr run fedgp-app fedgp --run-config "rounds=40')
        assert "privacy='{\\\"epsilon\\\": 4, \\\"rate\\\": 0.5}' secure-aggregation='{}'" in recipe, recipe
        dep.bash(recipe.replace("rounds=40", "rounds=5"))
        private = root / "private-model"
        wait_for(lambda: (private / "model.fedgp").exists(), 600, "the DP run's model", poll=0.1)
        history = pd.read_csv(private / "history.csv")
        assert list(history["participants"]) == [0, 3, 2, 1, 2], history
        assert list(history["skipped"]) == [False, False, False, True, False], history
        assert history["epsilon"].is_monotonic_increasing and history["epsilon"].iloc[-1] <= 4.0
        failures = pd.read_csv(private / "failures.csv")
        assert list(failures["round"]) == [4] and "secure aggregation: 1 node" in failures["reason"].iloc[0]
        assert not (private / "error.txt").exists()

        # A node lost mid-run, with secure aggregation and client-level DP (every round's clipped
        # updates are summed fields, so the protocol runs each round): its owner fails the remaining
        # rounds, the others' rounds complete.
        lost = root / "lost"
        privacy = '{\\"noise\\": 1.0, \\"delta\\": 0.01}'  # TOML literal strings inside bash's double quotes
        dep.bash(f"flwr run fedgp-app fedgp --run-config \"out-dir='{lost}' rounds=3 stop='none' "
                 f"timeout=30.0 secure-aggregation='{{}}' privacy='{privacy}'\"")  # fmt: skip
        wait_for(lambda: rounds_done(lost) >= 1, 600, "round 1 of the last run", poll=0.1)
        dep.kill_tree(dep.node("plant-c").pid)
        wait_for(lambda: (lost / "model.fedgp").exists(), 600, "the end of the run with a lost node")
        history = pd.read_csv(lost / "history.csv")
        failures = pd.read_csv(lost / "failures.csv")
        assert history["failed"].iloc[0] == 0 and history["failed"].iloc[-1] == 1
        assert set(failures["client"]) == {"plant-c"}
        assert failures["reason"].str.contains("no reply from Flower node").all()
    finally:
        dep.close()
        shutil.rmtree(root / "capture", ignore_errors=True)


@pytest.mark.slow
def test_the_same_app_runs_in_flowers_simulation_runtime_as_the_guide_says(tmp_path):
    """Section 7: ``flwr run fedgp-app local`` (a local SuperLink in simulation mode, Ray backend,
    3 simulated SuperNodes sharing one table by partition-id) ends at the in-process state."""
    root = tmp_path / "simulation"
    root.mkdir()
    tables = owner_tables(root)
    dep = Deployment(root)
    dep.env.update(
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()), FLWR_LOCAL_CONTROL_API_PORT=str(free_port())
    )
    try:
        dep.bash(dep.block("python -m fedgp.flower.security tls"))
        dep.bash(
            dep.block('mkdir -p "$FLWR_HOME"').replace("flwr supernode register", ": flwr supernode register")
        )
        block = dep.block("{ cat plant-a.csv")
        assert "rounds=20" in block
        dep.bash(block.replace("rounds=20", 'rounds=3 stop=\\"none\\"'), timeout=600)
        out = wait_for(lambda: (root / "sim-model" / "model.fedgp").exists() and root / "sim-model", 600,
                       "the simulation's model")  # fmt: skip
        model = fedgp.load(out / "model.fedgp")
        assert list(model.roster.ids) == list(OWNERS)  # partition order: the table's owner order
        reference = in_process({"rounds": 3, "stop": "none"}, list(OWNERS), tables)
        for key, value in reference.state.items():
            torch.testing.assert_close(model.state[key], value, rtol=1e-10, atol=0)
    finally:
        dep.close()


@pytest.mark.slow
def test_an_asynchronous_run_on_the_deployment_does_not_wait_for_its_slow_node(tmp_path):
    """Asynchronous FGPR measured as replies arrive (``speeds="measured"``, B = 2) on the three
    SuperNodes, plant-c slowed by ``train-delay``: the server steps on the two fast nodes' replies
    without waiting for it (a synchronous round could not end before plant-c's reply, so eight rounds
    would take at least eight delays), consumes plant-c's fewer replies stale and weighed down, and the
    model it writes predicts finitely. The fast nodes take ``pace`` s a job, so that the eight steps
    outlast plant-c's first job on a quiet machine too (else it might never arrive within the run)."""
    from fedgp.messages import config_json
    from fedgp.strategies import FGPR, Asynchronous

    delay, pace, rounds = 4.0, 1.0, 8
    root = tmp_path / "asynchronous"
    paced = {
        "plant-a": f"train-delay={pace}",
        "plant-b": f"train-delay={pace}",
        "plant-c": f"train-delay={delay}",
    }
    dep, run = start_deployment(root, capture=False, node_config=paced)
    try:
        strategy = Asynchronous(FGPR(local_steps=2, batch_size=16), buffer=2, speeds="measured")
        out = root / "model"
        config = f"out-dir='{out}' rounds={rounds} stop='none' timeout=60.0"
        config += f" strategy-config='{config_json(strategy)}'"  # JSON in a TOML literal string
        dep.bash(f'flwr run fedgp-app fedgp --run-config "{config.replace(chr(34), chr(92) + chr(34))}"')
        wait_for(
            lambda: (out / "model.fedgp").exists() or (out / "error.txt").exists(),
            300,
            "the model",
            poll=0.05,
        )
        assert not (out / "error.txt").exists(), (out / "error.txt").read_text()
        history = pd.read_csv(out / "history.csv")
        assert len(history) == rounds and (history["failed"] == 0).all(), history
        assert history["wall_time"].iloc[-1] < rounds * delay, history["wall_time"]
        model = fedgp.load(out / "model.fedgp")
        arrivals = model.server_state.arrivals(model.roster.ids)
        per_owner = arrivals["client"].value_counts()
        assert per_owner.get("plant-c", 0) < min(per_owner["plant-a"], per_owner["plant-b"]), per_owner
        slow = arrivals[arrivals["client"] == "plant-c"]
        assert len(slow) >= 1 and (slow["staleness"] > 0).all() and (slow["weight"] < 1).all(), arrivals
        assert (history["staleness_max"] > 0).any()
        from fedgp.data import ClientData

        X = torch.tensor([[0.1, -0.5, 0.9], [0.0, 0.0, 0.0]], dtype=torch.float64)
        for owner, table in owner_tables(root).items():  # each owner, from its own rows
            own = ClientData(table[["x1", "x2", "x3"]].to_numpy(), table["y"].to_numpy(), id=owner)
            mean, var = model.predict(X, own)
            assert torch.isfinite(mean).all() and (var > 0).all(), owner
    finally:
        dep.close()
