"""Does a batched fit slow down the torch work that follows it in the same process?

    .venv/bin/python benchmarks/thread_interference.py
    .venv/bin/python benchmarks/thread_interference.py --fedgp-root . /path/to/older/checkout  # side by side

In a fresh process with ``torch.set_num_threads(1)`` (as ``fedgp reproduce table2`` runs): a FedAvg
MLP fit (fedgp.baselines.FedAvgMLP, 60 clients) is timed, then a batched FGPR fit (K = 1,000, R = 2)
runs, then the same MLP fit is timed again, and the process CPU time of one second of sleep is
measured (spinning threads would show there). fedgp before this benchmark's change used numba's
OpenMP thread pool, which shares the OpenMP runtime with torch: after a batched fit torch ran on 2
threads despite ``set_num_threads(1)``, and the MLP's CPU time grew 3.1× on a quiet machine (6× on
a loaded one). Repeated in ``--repeats`` fresh processes; medians.

Writes results/benchmarks/thread_interference.csv (run, fedgp, mlp_cpu_before_s, mlp_cpu_after_s,
cpu_ratio, mlp_wall_before_s, mlp_wall_after_s, torch_threads_after, idle_cpu_s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads(1)
import fedgp
from fedgp.baselines import FedAvgMLP

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

small = fedgp.synthetic.gp_federation(num_clients=60, n=100, d=1, seed=0).federation

def mlp():
    c, w = cpu(), time.perf_counter()
    FedAvgMLP(rounds=30).fit(small)
    return cpu() - c, time.perf_counter() - w

mlp()  # warm-up (first-call costs)
before = mlp()
big = fedgp.synthetic.gp_federation(num_clients=1000, n=100, d=5, seed=0)
try:
    from fedgp.run import Evaluate
    quiet = {{"callbacks": [Evaluate(every=0)]}}
except ImportError:  # a checkout from before fedgp.run (--fedgp-root an older one)
    quiet = {{"progress": False, "eval_every": 0}}
fedgp.fit(big.spec, big.federation, fedgp.strategies.FGPR.authors(local_steps=5, batch_size=32), rounds=2,
          engine="batched", **quiet)
after = mlp()
c = cpu()
time.sleep(1.0)
idle = cpu() - c
print(json.dumps({{"fedgp": fedgp.__file__, "mlp_cpu_before_s": before[0], "mlp_cpu_after_s": after[0],
                  "mlp_wall_before_s": before[1], "mlp_wall_after_s": after[1],
                  "torch_threads_after": torch.get_num_threads(), "idle_cpu_s": idle}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fedgp-root",
        nargs="+",
        default=[str(ROOT)],
        help="the checkouts whose fedgp is measured (interleaved)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "thread_interference.csv"))
    args = parser.parse_args()

    import pandas as pd

    rows = []
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    for run in range(args.repeats):
        for root in args.fedgp_root:
            out = subprocess.run(
                [sys.executable, "-c", WORKER.format(root=str(Path(root).resolve()))],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            row = {"run": run, **json.loads(out.stdout.strip().splitlines()[-1])}
            row["cpu_ratio"] = row["mlp_cpu_after_s"] / row["mlp_cpu_before_s"]
            rows.append(row)
            print(
                f"run {run} ({row['fedgp']}): MLP CPU time {row['mlp_cpu_before_s']:.2f} s before, "
                f"{row['mlp_cpu_after_s']:.2f} s after a batched fit (×{row['cpu_ratio']:.2f}); "
                f"wall {row['mlp_wall_before_s']:.2f} → "
                f"{row['mlp_wall_after_s']:.2f} s; torch threads after: {row['torch_threads_after']}; "
                f"CPU time of 1 s asleep: {row['idle_cpu_s']:.3f} s",
                flush=True,
            )
    table = pd.DataFrame(rows)
    for name, group in table.groupby("fedgp", sort=False):
        print(f"median CPU-time ratio after/before: {group['cpu_ratio'].median():.2f} ({name})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    columns = [
        "run",
        "fedgp",
        "mlp_cpu_before_s",
        "mlp_cpu_after_s",
        "cpu_ratio",
        "mlp_wall_before_s",
        "mlp_wall_after_s",
        "torch_threads_after",
        "idle_cpu_s",
    ]
    table[columns].to_csv(out, index=False, float_format="%.4g")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
