"""How long ``fedgp fit`` takes on a table with very many small owners, end to end.

    .venv/bin/python benchmarks/cli_many_owners.py --owners 100000

Writes a CSV of ``--owners`` owners × 2 rows (2 features, target ``y``, owner ``o<i>``) into a
temporary folder, then runs ``fedgp fit DATA.csv --target y --group owner --rounds 1 --stop none
--quiet`` in a fresh process and reports its wall time and peak RSS. Appends a row to
results/benchmarks/cli_many_owners.csv (owners, rows, seconds, peak RSS in MB, date).
"""

from __future__ import annotations

import argparse
import datetime
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "cli_many_owners.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=10_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = 2 * args.owners
    table = pd.DataFrame(
        {
            "x1": rng.random(n),
            "x2": rng.random(n),
            "y": rng.normal(size=n),
            "owner": [f"o{i}" for i in np.repeat(np.arange(args.owners), 2)],
        }
    )
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "owners.csv"
        table.to_csv(data, index=False)
        out = str(Path(folder) / "out")
        command = [sys.executable, "-m", "fedgp.cli", "fit", str(data), "--target", "y", "--group", "owner",
                   "--rounds", "1", "--stop", "none", "--quiet", "--out", out]  # fmt: skip
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"fedgp fit failed:\n{done.stderr[-3000:]}")
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    row = pd.DataFrame(
        [
            dict(
                owners=args.owners,
                rows=n,
                seconds=round(seconds, 1),
                peak_rss_mb=round(peak_mb),
                date=datetime.date.today().isoformat(),
            )
        ]  # fmt: skip
    )
    row.to_csv(OUT, mode="a", header=not OUT.exists(), index=False)
    print(row.to_string(index=False))


if __name__ == "__main__":
    main()
