"""Wall and CPU time of every ``fedgp reproduce NAME --quick`` (and ``fedgp demo --quick``), as a user
runs it: a fresh process each, imports included, writing into a temporary folder.

    FEDGP_DATA=../shared/datasets OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cli_quick_times.py
    .venv/bin/python benchmarks/cli_quick_times.py --only table2 demo     # some of them

Writes results/benchmarks/cli_quick_times.csv: one row per command with its wall time, the CPU time
of the process (user + system, children included), the 1-minute load average before and after
(the machine may be shared: CPU time is the figure that load changes least), the exit code and
the environment that matters (OMP_NUM_THREADS, NUMBA_NUM_THREADS, FEDGP_WORKERS). The ``--help`` of
``fedgp reproduce`` quotes these figures (``fedgp.experiments.registry.QUICK_RUNTIMES``;
``tests/test_cli.py`` checks that the two agree). ``FEDGP_CACHE`` is removed from the environment so
that nothing is reused from an earlier run. ``verdicts`` trains nothing: it runs on a copy of
``results/``, as ``fedgp reproduce verdicts --out results`` does.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "results" / "benchmarks" / "cli_quick_times.csv"

from fedgp.experiments.registry import REPRODUCTIONS  # noqa: E402


def command(name: str, out: Path) -> list[str]:
    head = [sys.executable, "-m", "fedgp.cli"]
    if name == "demo":
        return [*head, "demo", "--quick", "--out", str(out), "--quiet"]
    return [*head, "reproduce", name, "--quick", "--out", str(out), "--quiet"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(name: str, env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"fedgp-quick-{name}-") as tmp:
        out = Path(tmp) / "out"
        if name == "verdicts":  # it reads the committed CSVs of the folder it writes to
            shutil.copytree(REPO / "results", out)
        load_before = os.getloadavg()[0]
        cpu_before = children_cpu()
        began = time.perf_counter()
        run = subprocess.run(command(name, out), env=env, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - began
        cpu = children_cpu() - cpu_before
        load_after = os.getloadavg()[0]
    if run.returncode != 0:
        print(run.stderr[-2000:], file=sys.stderr)
    return {
        "command": "demo --quick" if name == "demo" else f"reproduce {name} --quick",
        "name": name,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "load1_before": round(load_before, 2),
        "load1_after": round(load_after, 2),
        "returncode": run.returncode,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {os.cpu_count()} vCPU, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", ""),
        "NUMBA_NUM_THREADS": env.get("NUMBA_NUM_THREADS", ""),
        "FEDGP_WORKERS": env.get("FEDGP_WORKERS", ""),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, help="these names only (demo for fedgp demo)")
    parser.add_argument("--out", default=str(OUT), help=f"CSV to write (default {OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    names = args.only or [*REPRODUCTIONS, "demo"]
    unknown = [n for n in names if n != "demo" and n not in REPRODUCTIONS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    env = {k: v for k, v in os.environ.items() if k not in ("FEDGP_CACHE", "FEDGP_QUICK")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    out = Path(args.out)
    rows = []
    previous = pd.read_csv(out) if out.exists() and args.only else None
    for name in names:
        row = measure(name, env)
        rows.append(row)
        print(
            f"{row['command']:<36} wall {row['wall_s']:8.1f} s  cpu {row['cpu_s']:8.1f} s  "
            f"load {row['load1_before']:.2f} -> {row['load1_after']:.2f}  rc {row['returncode']}",
            flush=True,
        )
        table = pd.DataFrame(rows)
        if previous is not None:  # --only replaces those rows and keeps the others
            table = pd.concat([previous[~previous["name"].isin(table["name"])], table], ignore_index=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
