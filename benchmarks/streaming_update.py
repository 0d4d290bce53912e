"""An owner whose data grow: the rank-k update of its posterior against refitting it (issue 54, item 4).

    PYTHONPATH=. .venv/bin/python benchmarks/streaming_update.py         # n = 4,000, k = 100, 1 thread
    PYTHONPATH=. .venv/bin/python benchmarks/streaming_update.py --k 1 10 100 400 --threads 1 2

One owner of ``n`` rows (d = 5, float64, fixed hyper-parameters: an RBF kernel with ARD, noise 0.01)
adds ``k`` rows. Timed, interleaved in each repeat, median over ``--repeats``:

- ``update_s``: :meth:`GrowingPosterior.extend <fedgp.models.streaming.GrowingPosterior.extend>` — the
  factor's new block (the n×k cross-covariance, one triangular solve, a k×k Cholesky), what
  ``FitResult.update`` runs;
- ``refit_s``: its posterior built again on all n + k rows — the (n + k)² kernel matrix, its full
  Cholesky and the whitened residual (the same code from scratch);
- ``gpytorch_refit_s`` / ``update_predict_s``: end to end for one prediction of 10 points: GPyTorch's
  exact posterior on all rows (:func:`fedgp.models.posterior.condition`, what a refitted owner's
  ``predict`` runs) against the update followed by the prediction from the grown factor.

The two posteriors' largest differences at the 10 points are recorded too (they agree to rounding).
``--threads``: torch's threads for each row (default 1: on a machine shared with other work, torch's
second thread waits for a core and slows both paths unevenly; ``benchmarks/threads_under_load.py``).
Writes results/benchmarks/streaming_update.csv, one row per k, with the command that made it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "results" / "benchmarks" / "streaming_update.csv"

import fedgp  # noqa: E402
from fedgp.models.posterior import condition  # noqa: E402
from fedgp.models.streaming import GrowingPosterior  # noqa: E402


def measure(n: int, k: int, d: int, repeats: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n + k, d, generator=g, dtype=torch.float64)
    y = torch.sin(6 * X).sum(1) + 0.1 * torch.randn(n + k, generator=g, dtype=torch.float64)
    at = torch.rand(10, d, generator=g, dtype=torch.float64)
    spec = fedgp.GPSpec(input_dim=d)
    state = spec.state({"likelihood.noise_covar.noise": 0.01, "covar_module.base_kernel.lengthscale": 0.5})
    times: dict[str, list[float]] = {"update": [], "refit": [], "gpytorch": [], "update_predict": []}
    for _ in range(repeats):
        held = GrowingPosterior(spec, state, X[:n], y[:n])  # the owner's factor before the rows came
        start = time.perf_counter()
        held.extend(X[n:], y[n:])
        times["update"].append(time.perf_counter() - start)
        start = time.perf_counter()
        refit = GrowingPosterior(spec, state, X, y)
        times["refit"].append(time.perf_counter() - start)
        start = time.perf_counter()
        reference = condition(spec, state, X, y, at)
        times["gpytorch"].append(time.perf_counter() - start)
        held = GrowingPosterior(spec, state, X[:n], y[:n])
        start = time.perf_counter()
        held.extend(X[n:], y[n:])
        grown = held.predict(at)
        times["update_predict"].append(time.perf_counter() - start)
    mine, again = grown, refit.predict(at)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "n": n,
        "k": k,
        "d": d,
        "repeats": repeats,
        "update_s": round(median["update"], 5),
        "refit_s": round(median["refit"], 5),
        "speedup": round(median["refit"] / median["update"], 1),
        "gpytorch_refit_s": round(median["gpytorch"], 5),
        "update_predict_s": round(median["update_predict"], 5),
        "speedup_end_to_end": round(median["gpytorch"] / median["update_predict"], 1),
        "max_abs_mean_diff": float((mine.mean - reference.mean).abs().max()),
        "max_abs_var_diff": float((mine.variance_f - reference.variance_f).abs().max()),
        "max_abs_mean_diff_refit": float((mine.mean - again.mean).abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--k", type=int, nargs="+", default=[100])
    parser.add_argument("--d", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    command = "benchmarks/streaming_update.py " + " ".join(sys.argv[1:])
    rows = []
    for threads in args.threads:
        for k in args.k:
            torch.set_num_threads(threads)
            row = measure(args.n, k, args.d, args.repeats, args.seed)
            row.update(
                threads=threads,
                load1=round(os.getloadavg()[0], 2),  # the machine's load as the row finished
                machine=f"{platform.machine()} {os.cpu_count()} vCPU, CPython {platform.python_version()}",
                date=str(date.today()),
                command=command.strip(),
            )
            print(
                f"n={row['n']} k={k}: update {row['update_s']:.4f} s, refit {row['refit_s']:.4f} s "
                f"({row['speedup']}x); with a prediction: {row['update_predict_s']:.4f} s against GPyTorch's "
                f"{row['gpytorch_refit_s']:.4f} s ({row['speedup_end_to_end']}x); "
                f"|Δmean| {row['max_abs_mean_diff']:.1e}",
                flush=True,
            )
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
