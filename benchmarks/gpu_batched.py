"""The batched engine on a GPU against the CPU, float64 and float32, in one run (issue 16).

    .venv/bin/python benchmarks/gpu_batched.py                    # K = 10,000, R = 10
    .venv/bin/python benchmarks/gpu_batched.py --clients 200 --rounds 2 --repeats 1 \
        --device cpu --out /tmp/dry.csv                           # a dry run without a GPU

FGPR (M = 32, d = 5, E = 5 Adam steps, RBF-ARD, 64 points per client), evaluation off, as in the
README's Performance table. For each precision: ``fit(..., device=DEVICE)`` (the tensor path) and
the CPU batched engine (compiled step where numba is installed), medians of ``--repeats`` after an
untimed warm-up; client-steps per second, the ratio, and the largest relative difference of the
final states. Writes results/benchmarks/gpu_batched.csv with the device's name.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

import fedgp
from fedgp.data import gp_federation
from fedgp.strategies import FGPR

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "gpu_batched.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    K, R, E = args.clients, args.rounds, 5
    draws = gp_federation(num_clients=K, n=64, d=5, seed=0)
    strategy = FGPR(local_steps=E, batch_size=32)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    rows = []
    for dtype in (torch.float64, torch.float32):
        spec = fedgp.GPSpec(kernel=draws.spec.kernel, dtype=dtype)
        runs = {}
        for where in ("cpu", args.device):

            def fit(where=where, spec=spec):
                result = fedgp.fit(
                    spec,
                    draws.federation,
                    strategy,
                    rounds=R,
                    engine="batched",
                    device=where,
                    eval_every=0,
                    outcome_transform=None,  # the engine alone, as the CPU benchmarks measure it
                    input_transform=None,
                )
                if where.startswith("cuda"):
                    torch.cuda.synchronize()
                return result

            runs[where] = fit()  # warm-up: kernels compiled, data copied
            times = []
            for _ in range(args.repeats):
                began = time.perf_counter()
                fit()
                times.append(time.perf_counter() - began)
            runs[where, "s"] = statistics.median(times)
        diff = runs[args.device].state.max_relative_difference(runs["cpu"].state)
        for where in ("cpu", args.device):
            rows.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "device": where,
                    "device_name": name if where == args.device else "cpu",
                    "clients": K,
                    "rounds": R,
                    "seconds": runs[where, "s"],
                    "client_steps_per_s": K * R * E / runs[where, "s"],
                    "max_rel_diff_vs_cpu": diff if where == args.device else 0.0,
                }
            )
    frame = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
