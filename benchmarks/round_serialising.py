"""How long a batched fit spends turning messages into bytes in process (cProfile), per round.

    .venv/bin/python benchmarks/round_serialising.py                  # K = 1,000
    .venv/bin/python benchmarks/round_serialising.py --clients 100 1000 --append

FGPR as in benchmarks/engine_throughput.py (100 points per client, d = 5, M = 32, E = 5 Adam steps,
RBF-ARD, float64), ``engine="batched"`` without loopback, one thread, evaluation off. In one fresh
process per K (after a small untimed fit that fills numba's cache), fits of 1 and 3 rounds run
under cProfile. For each it sums the cumulative time of the container's ``pack`` (every task and
record written to bytes goes through it) and of ``packed_size`` (the byte counts computed from
shapes, under :func:`fedgp.messages.task_size` and :func:`fedgp.messages.split_size`), with their
call counts; a round's share is the 3-round figure less the 1-round one, halved (the 1-round fit
also registers the clients and summarises their data). An in-process engine should serialise
nothing: the history's ``bytes_down``/``bytes_up`` are computed, equal byte for byte to what the
wire would carry.

Writes results/benchmarks/round_serialising.csv (K; for the 3-round fit fit_s, pack_calls, pack_s,
sizes_calls, sizes_s; a round's round_pack_s, round_pack_calls, round_sizes_s; commit: the measured
checkout's, ``+changes`` when it had uncommitted ones); ``--append`` keeps the earlier rows (a
before/after pair).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's fedgp (also in the worker processes)
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "results" / "benchmarks" / "round_serialising.csv"


def _totals(stats) -> dict:
    """Calls and cumulative seconds of the container's ``pack`` (writing) and ``packed_size``
    (counting without writing)."""
    out = {"pack_calls": 0, "pack_s": 0.0, "sizes_calls": 0, "sizes_s": 0.0}
    for (path, _, name), (_, calls, _, cumulative, _) in stats.stats.items():
        if not path.replace("\\", "/").endswith("fedgp/messages/container.py"):
            continue
        if name in ("pack", "packed_size"):
            key = "pack" if name == "pack" else "sizes"
            out[f"{key}_calls"] += calls
            out[f"{key}_s"] += cumulative
    return out


def worker(K: int) -> dict:
    import cProfile
    import pstats

    import torch

    torch.set_num_threads(1)
    from engine_throughput import batched_fit, make_federation

    batched_fit(make_federation(64), 1, stop=None)  # numba's cache, first calls
    fed = make_federation(K)
    row: dict = {"K": K}
    totals = {}
    for rounds in (1, 3):
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.runcall(batched_fit, fed, rounds, stop=None)
        wall = time.perf_counter() - start
        totals[rounds] = _totals(pstats.Stats(profiler))
        if rounds == 3:
            row.update(fit_s=wall, **totals[3])
    row["round_pack_s"] = (totals[3]["pack_s"] - totals[1]["pack_s"]) / 2
    row["round_pack_calls"] = (totals[3]["pack_calls"] - totals[1]["pack_calls"]) // 2
    row["round_sizes_s"] = (totals[3]["sizes_s"] - totals[1]["sizes_s"]) / 2
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1_000])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--append", action="store_true", help="keep the rows already in --out")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    from fit_fixed_cost import commit, write_rows

    rows = []
    for K in args.clients:
        command = [sys.executable, __file__, "--worker", str(K)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["commit"] = commit()
        rows.append(row)
        print(f"K = {K:>7,}: 3-round fit {row['fit_s']:.2f} s under cProfile; pack: {row['pack_calls']} "
              f"calls, {row['pack_s'] * 1e3:.1f} ms; packed_size: {row['sizes_calls']} calls, "
              f"{row['sizes_s'] * 1e3:.2f} ms. A round: {row['round_pack_calls']} packs, "
              f"{row['round_pack_s'] * 1e3:.2f} ms writing bytes, "
              f"{row['round_sizes_s'] * 1e3:.2f} ms counting them")  # fmt: skip
    write_rows(rows, args.out, args.append)


if __name__ == "__main__":
    main()
