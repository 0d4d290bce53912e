"""What a batched fit costs beyond its rounds, against the number of clients (fresh process per K).

    .venv/bin/python benchmarks/fit_fixed_cost.py                      # K = 10,000 and 100,000
    .venv/bin/python benchmarks/fit_fixed_cost.py --clients 2000       # quick

FGPR as in benchmarks/engine_throughput.py (100 points per client, d = 5, M = 32, E = 5 Adam steps,
RBF-ARD, float64), ``engine="batched"``, one thread, evaluation off, default transforms (the
federated summary, then every client's data in the transformed units). In one fresh process per
K (after a small untimed fit that fills numba's cache): fits of 1 and 3 rounds, ``repeats`` times
alternately. A round costs (T₃ − T₁) / 2; the fixed cost of a fit is T₁ minus one round: the
transforms' summary and application, the roster, the engine's build, the result. Its share per
client is printed in microseconds. ``--profile`` adds the top fedgp functions of one 1-round fit
by cumulative time (cProfile) to the printout.

Writes results/benchmarks/fit_fixed_cost.csv (K, rounds_1_s, rounds_3_s, round_s, fixed_s,
fixed_us_per_client, commit: the measured checkout's commit, ``+changes`` when it had uncommitted
ones); ``--append`` adds the rows to the file's earlier ones (a before/after pair).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's fedgp (also in the worker processes)
OUT = ROOT / "results" / "benchmarks" / "fit_fixed_cost.csv"


def commit() -> str:
    """The measured checkout's commit (``+changes`` when the tree differs from it)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "fedgp") else "")


def worker(K: int, repeats: int, profile: bool) -> dict:
    import torch

    torch.set_num_threads(1)

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from engine_throughput import batched_fit, make_federation

    def fit(fed, rounds: int) -> float:
        start = time.perf_counter()
        batched_fit(fed, rounds, stop=None)
        return time.perf_counter() - start

    fit(make_federation(64), 1)  # numba's cache, first calls
    fed = make_federation(K)
    times: dict[int, list[float]] = {1: [], 3: []}
    for _ in range(repeats):
        for rounds in (1, 3):
            times[rounds].append(fit(fed, rounds))
    t1, t3 = statistics.median(times[1]), statistics.median(times[3])
    row = {"K": K, "rounds_1_s": t1, "rounds_3_s": t3, "round_s": (t3 - t1) / 2}
    row["fixed_s"] = t1 - row["round_s"]
    row["fixed_us_per_client"] = 1e6 * row["fixed_s"] / K
    if profile:
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(fit, fed, 1)
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).sort_stats("cumulative")
        stats.print_stats("fedgp", 25)
        row["profile"] = text.getvalue()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--append", action="store_true", help="keep the rows already in --out")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.repeats, args.profile)))
        return
    rows = []
    for K in args.clients:
        command = [sys.executable, __file__, "--worker", str(K), "--repeats", str(args.repeats)]
        done = subprocess.run(command + (["--profile"] if args.profile else []), capture_output=True,
                              text=True, check=True)  # fmt: skip
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(row.pop("profile", ""))
        row["commit"] = commit()
        rows.append(row)
        print(f"K = {K:>7,}: 1 round {row['rounds_1_s']:.2f} s, 3 rounds {row['rounds_3_s']:.2f} s; "
              f"a round {row['round_s']:.2f} s, fixed {row['fixed_s']:.2f} s "
              f"({row['fixed_us_per_client']:.0f} µs per client)")  # fmt: skip
    write_rows(rows, args.out, args.append)


def write_rows(rows: list[dict], out: Path, append: bool) -> None:
    """``rows`` as the CSV ``out``, after the rows already there with ``append``."""
    import pandas as pd

    out.parent.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows)
    if append and out.exists():
        table = pd.concat([pd.read_csv(out), table], ignore_index=True)
    table.to_csv(out, index=False, float_format="%.4g")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
