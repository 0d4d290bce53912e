"""Peak memory of the batched engine against the number of clients (fresh process per K).

    .venv/bin/python benchmarks/engine_memory.py                       # K = 10,000, 30,000, 100,000
    .venv/bin/python benchmarks/engine_memory.py --clients 2000 6000   # quick

FGPR as in benchmarks/engine_throughput.py (M = 32, d = 5, E = 5 Adam steps, RBF-ARD, float64, 100
points per client), R = 10 rounds, ``engine="batched"``, one thread. Each K runs in its own
process (after one small untimed run that fills numba's cache of compiled code, whose compilation
would otherwise add its own memory to the first process), which reports its resident set size
(``ru_maxrss``: the peak) after the imports, after building the federation, and after the fit.
The target: K = 100,000 in at most 4 GiB, memory linear in K. The slope and intercept of a
least-squares line through the peaks are printed; the residuals say how far from linear the
points are.

Writes results/benchmarks/engine_memory.csv (K, rounds, rss_import_mb, rss_data_mb, peak_rss_mb,
data_s, fit_s, client_steps_per_s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's fedgp (also in the worker processes)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux


def worker(K: int, rounds: int) -> dict:
    import torch

    torch.set_num_threads(1)
    import fedgp  # noqa: F401 - its memory is counted in rss_import

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from engine_throughput import E, batched_fit, make_federation

    rss_import = _rss_mb()
    start = time.perf_counter()
    fed = make_federation(K)
    data_s = time.perf_counter() - start
    rss_data = _rss_mb()
    start = time.perf_counter()
    batched_fit(fed, rounds)
    fit_s = time.perf_counter() - start
    return {
        "K": K,
        "rounds": rounds,
        "rss_import_mb": rss_import,
        "rss_data_mb": rss_data,
        "peak_rss_mb": _rss_mb(),
        "data_s": data_s,
        "fit_s": fit_s,
        "client_steps_per_s": K * E * rounds / fit_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "engine_memory.csv"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.rounds)))
        return

    import numpy as np
    import pandas as pd

    def measure(K: int, rounds: int) -> dict:
        out = subprocess.run(
            [sys.executable, __file__, "--worker", str(K), "--rounds", str(rounds)],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if out.returncode:
            raise RuntimeError(f"the K={K} worker failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    measure(64, 1)  # compiles the kernels into numba's cache: compiling is not what is measured
    rows = []
    for K in args.clients:
        row = measure(K, args.rounds)
        rows.append(row)
        print(
            f"K={K:>7}: peak RSS {row['peak_rss_mb']:.0f} MB (after imports {row['rss_import_mb']:.0f}, "
            f"with the federation {row['rss_data_mb']:.0f}); federation built in {row['data_s']:.1f} s, "
            f"fit (R={args.rounds}) {row['fit_s']:.1f} s",
            flush=True,
        )
    table = pd.DataFrame(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False, float_format="%.4g")
    if len(table) >= 2:
        slope, intercept = np.polyfit(table["K"], table["peak_rss_mb"], 1)
        residual = table["peak_rss_mb"] - (slope * table["K"] + intercept)
        data_slope = np.polyfit(table["K"], table["rss_data_mb"], 1)[0]
        print(
            f"peak RSS ≈ {intercept:.0f} MB + {slope * 1000:.1f} MB per 1,000 clients "
            f"(largest residual {residual.abs().max():.0f} MB); "
            f"of which the federation itself: {data_slope * 1000:.1f} MB per 1,000 clients"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
