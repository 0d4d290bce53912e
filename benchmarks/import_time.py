"""How long ``python -c "import fedgp"`` takes, against what it costs to use fedgp and to import torch.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/import_time.py [--runs 7]

Each statement runs in a fresh interpreter (the same one running this script), ``--runs`` times,
interleaved so that a change of machine load hits every row alike; prints the median and range of
the wall time per statement and writes results/benchmarks/import_time.csv. The rows:

* ``python -c pass``: the interpreter's own start-up;
* ``import fedgp``: the package alone; its subpackages are imported on first use (PEP 562);
* ``import fedgp; fedgp.fit``: first use of the top-level API (torch, GPyTorch, pandas, ...);
* the eager import: what ``import fedgp`` did before the subpackages became lazy (it imported
  aggregators, attacks, clustering, data, export, models, stopping, strategies and ``fit``; today
  ``fedgp.run`` holds the stopping rules and ``fit``, and what ``fedgp.data`` held then is split
  between ``fedgp.data``, ``fedgp.synthetic`` and ``fedgp.datasets``);
* ``import torch``: the floor under any use of fedgp.

``python -X importtime -c "import fedgp"`` shows where the time of one import goes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "benchmarks" / "import_time.csv"
STATEMENTS = {
    "python -c pass": "pass",
    "import fedgp": "import fedgp",
    "import fedgp; fedgp.fit": "import fedgp; fedgp.fit",
    "eager import (before)": (
        "import fedgp; from fedgp import aggregators, attacks, clustering, data, datasets, export, "
        "models, run, strategies, synthetic; from fedgp.run import FitResult, fit"
    ),
    "import torch": "import torch",
}


def wall_time(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], cwd=ROOT, check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per statement (default 7)")
    parser.add_argument("--no-save", action="store_true", help="print only, write no CSV")
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {label: [] for label in STATEMENTS}
    for _ in range(args.runs):
        for label, statement in STATEMENTS.items():
            times[label].append(wall_time(statement))
    table = pd.DataFrame(
        [
            {
                "statement": label,
                "median_s": statistics.median(values),
                "min_s": min(values),
                "max_s": max(values),
                "runs": len(values),
            }
            for label, values in times.items()
        ]
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if not args.no_save:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(OUT, index=False)
        print(f"wrote {OUT.relative_to(ROOT)}")
    return table


if __name__ == "__main__":
    main()
