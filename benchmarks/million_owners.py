"""Peak memory and wall time of ``fedgp fit`` on 10⁶ owners × 2 rows, optionally under a memory limit.

    .venv/bin/python benchmarks/million_owners.py --owners 1000000 --rounds 3
    .venv/bin/python benchmarks/million_owners.py --owners 1000000 --tree /path/to/other/checkout
    .venv/bin/python benchmarks/million_owners.py --owners 300000 --limit-gib 1.25

Writes a CSV of ``--owners`` owners × 2 rows (features ``x1``, ``x2``, target ``y``, owner ``o<i>``)
into a temporary folder, then runs ``python -m fedgp.cli fit DATA.csv --target y --group owner
--rounds R --stop none --quiet`` in a fresh process, with the package of ``--tree`` (default this
checkout) first on ``PYTHONPATH`` and, with ``--limit-gib``, its address space capped
(``RLIMIT_AS``, what ``ulimit -v`` sets). Reports the wall time, the child's peak RSS, its exit
status and the last line of its stderr, and appends them to results/benchmarks/million_owners.csv
with the tree's commit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "benchmarks" / "million_owners.csv"


def owners_table(owners: int, path: Path) -> None:
    """``owners`` owners × 2 rows of uniform features and a normal target, seeded."""
    rng = np.random.default_rng(0)
    n = 2 * owners
    labels = np.char.add("o", np.repeat(np.arange(owners), 2).astype(str))
    pd.DataFrame({"x1": rng.random(n), "x2": rng.random(n), "y": rng.normal(size=n), "owner": labels}).to_csv(
        path, index=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose fedgp runs")
    parser.add_argument("--limit-gib", type=float, default=None, help="cap the address space (GiB)")
    parser.add_argument("--label", default=None, help="the tree's name in the table (default its commit)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(args.tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "-C", str(args.tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(args.tree.resolve())}

    def cap() -> None:
        if args.limit_gib is not None:
            limit = int(args.limit_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "owners.csv"
        owners_table(args.owners, data)
        out = str(Path(folder) / "out")
        command = [sys.executable, "-m", "fedgp.cli", "fit", str(data), "--target", "y", "--group", "owner",
                   "--rounds", str(args.rounds), "--stop", "none", "--quiet", "--out", out]  # fmt: skip
        began = time.perf_counter()
        # run in the tree: ``python -m`` puts the working directory ahead of PYTHONPATH
        done = subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=cap, cwd=args.tree)
        seconds = time.perf_counter() - began
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux: MiB
    last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
    row = pd.DataFrame(
        [
            dict(
                owners=args.owners,
                rows=2 * args.owners,
                rounds=args.rounds,
                tree=args.label or (commit + ("+changes" if dirty else "")),
                limit_gib=args.limit_gib,
                seconds=round(seconds, 1),
                peak_rss_mib=round(peak_mb),
                exit_status=done.returncode,
                traceback="Traceback" in done.stderr,
                stderr_last_line=last[:200],
                date=datetime.date.today().isoformat(),
            )
        ]
    )
    row.to_csv(OUT, mode="a", header=not OUT.exists(), index=False)
    print(row.T.to_string(header=False))


if __name__ == "__main__":
    main()
