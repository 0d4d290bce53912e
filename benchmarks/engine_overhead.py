"""Per-round cost of each engine for 3 nodes (6 small clients), against the in-process engines.

    .venv/bin/python benchmarks/engine_overhead.py              # all engines, the deployment included
    .venv/bin/python benchmarks/engine_overhead.py --no-deployment    # keeps the deployment rows
    .venv/bin/python benchmarks/engine_overhead.py --deployment-only --rounds 12  # keeps the others

FGPR, 6 GP-draw clients of 24 points (2 per node or worker), 3 local Adam steps of 8 points: the
clients' computation is small, so the figures are the engines' own cost per round. For every
engine, the wall time of a fit of R rounds minus that of 1 round, over R − 1 (start-up, the hello
exchange and first calls excluded); evaluation off. Engines: ``sequential``, ``batched`` (in
process); ``ray`` (3 local workers); ``flower`` (in process, 3 nodes, every message through
Flower's wire format); Flower's simulation runtime (Ray backend, 3 SuperNodes); a real deployment
(the Deployment guide's commands, as the deployment test runs them: TLS, 3 authenticated
SuperNodes, ``flwr run``), with Flower's ``flower-supernode`` and with ``fedgp flower
supernode``. ``--deployment-only`` measures just those two. Writes
results/benchmarks/engine_overhead.csv.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

import fedgp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "results" / "benchmarks" / "engine_overhead.csv"


def per_round(run, rounds: int, repeats: int) -> float:
    """(time of ``rounds`` rounds − time of 1 round) / (rounds − 1), median over repeats."""
    out = []
    for _ in range(repeats):
        began = time.perf_counter()
        run(1)
        one = time.perf_counter() - began
        began = time.perf_counter()
        run(rounds)
        many = time.perf_counter() - began
        out.append((many - one) / (rounds - 1))
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-deployment", action="store_true")
    parser.add_argument("--deployment-only", action="store_true", help="only the two deployment rows")
    args = parser.parse_args()
    if args.deployment_only:
        os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
        os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
        rows = deployment_rows(args.rounds)
        if OUT.exists():  # keep the in-process rows of the last full run
            old = pd.read_csv(OUT)
            rows = [*old[~old["engine"].str.startswith("flower deployment")].to_dict("records"), *rows]
        pd.DataFrame(rows).to_csv(OUT, index=False)
        print(f"wrote {OUT}")
        return
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    torch.set_num_threads(1)
    from tests.flower import app

    draws = app.federation()
    strategy = app.strategy("fgpr")
    rows = []

    from fedgp.flower import Flower

    def engine_run(engine):
        def run(rounds):
            fedgp.fit(
                draws.spec,
                draws.federation,
                strategy,
                rounds=rounds,
                engine=engine,
                seed=5,
                callbacks=[fedgp.run.Evaluate(every=0)],
            )

        return run

    for name, engine in (
        ("sequential", fedgp.engines.Sequential()),
        ("batched", fedgp.engines.Batched()),
        ("ray (3 workers)", fedgp.engines.Ray(num_workers=3, keep_alive=True)),  # warm actors between fits
        ("flower, in process (3 nodes)", Flower(num_nodes=3)),
    ):
        run = engine_run(engine)
        run(1)  # warm: imports, actors, compiled code
        rows.append({"engine": name, "seconds_per_round": per_round(run, args.rounds, args.repeats)})
        print(rows[-1], flush=True)
    from fedgp.engines.ray import shutdown

    shutdown()

    from flwr.simulation import run_simulation

    def simulation(rounds):
        with tempfile.TemporaryDirectory() as out:
            os.environ["FEDGP_FLOWER_OUT"] = out
            os.environ["FEDGP_FLOWER_ROUNDS"] = str(rounds)
            run_simulation(
                app.serverapp,
                app.clientapp,
                num_supernodes=3,
                backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
            )
            assert (Path(out) / "state.json").exists(), "the simulated ServerApp failed"

    rows.append(
        {
            "engine": "flower simulation, Ray backend (3 SuperNodes)",
            "seconds_per_round": per_round(simulation, args.rounds, 1),
        }
    )
    print(rows[-1], flush=True)
    if not args.no_deployment:
        rows += deployment_rows(args.rounds)
    elif OUT.exists():  # keep the deployment rows of the last run that measured them
        old = pd.read_csv(OUT)
        rows += old[old["engine"].str.startswith("flower deployment")].to_dict("records")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(OUT, index=False)
    print(f"wrote {OUT}")


def deployment_per_round(rounds: int, stock: bool = False) -> float:
    """The Deployment guide's deployment (3 owners x 40 rows of 3 features, one per SuperNode, TLS,
    authenticated nodes, the SuperLink on 127.0.0.2), default FGPR, no stop rule: the median of
    the seconds per round the ServerApp logs (``fedgp round k/R: ..., S s``, read back with
    ``flwr log``), rounds 2 to R (round 1 includes the nodes' first ClientApp)."""
    import json
    import re
    import subprocess

    from tests.flower.test_flower_deployment import BIN, start_deployment

    with tempfile.TemporaryDirectory() as folder:
        dep, run_app = start_deployment(Path(folder) / "deployment", capture=False, stock=stock)
        try:
            run_app(Path(folder) / "out", rounds=rounds, stop="none")
            listing = dep.bash("flwr ls fedgp --format json")
            run_id = json.loads(listing[listing.index("{") :])["runs"][0]["run-id"]
            env = {**dep.env, "FLWR_HOME": str(dep.root / "flwr-home")}
            log = subprocess.run([str(BIN / "flwr"), "log", str(run_id), "fedgp", "--show"], cwd=dep.root,
                                 env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
            seconds = [float(s) for s in re.findall(r"fedgp round \d+/\d+: .*?, ([0-9.]+) s", log.stdout)]
            assert len(seconds) == rounds, log.stdout[-2000:]
            return statistics.median(seconds[1:])
        finally:
            dep.close()


def deployment_rows(rounds: int) -> list[dict]:
    """Flower's own SuperNode and ``fedgp flower supernode``, measured one after the other."""
    rows = []
    for stock, name in ((True, "flower-supernode"), (False, "fedgp flower supernode")):
        seconds = deployment_per_round(rounds, stock)
        rows.append(
            {"engine": f"flower deployment, TLS, 3 SuperNodes ({name})", "seconds_per_round": seconds}
        )
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
