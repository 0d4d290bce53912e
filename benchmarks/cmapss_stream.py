"""C-MAPSS as a stream: each engine's cycles arrive in order; update the owner's posterior or refit.

    FEDGP_DATA=../shared/datasets PYTHONPATH=. .venv/bin/python benchmarks/cmapss_stream.py
    ... --sensor s11 --engines 30 --start 50 --chunk 20 --refit-every 2

Issue 54, study (b). FD001's training engines are owners; each holds its first ``--start`` cycles
when the federation is fitted (FGPR, its defaults, ``--rounds`` rounds on the batched engine; one
sensor against ``cycle / 100``, the data transforms learned at the start). Then the cycles arrive
``--chunk`` at a time per engine, in order, until every engine's run ends. Before each chunk
arrives, every engine forecasts it, and the forecast is scored against what arrives (RMSE and
mean NLL per point, in the sensor's units, over the engines still running):

- ``fixed``: the model as fitted, conditioned on the first cycles only;
- ``update``: after each chunk, ``result.update(engine, X, y)`` (the rank-k Cholesky extension);
- ``refit posterior``: the same hyper-parameters, the posterior built again on all rows arrived
  (a new ``ClientData`` of them): the same forecast as ``update`` to rounding (the largest
  difference is recorded), timed against it;
- ``refit``: every ``--refit-every`` chunks, the federation fitted again on all rows arrived,
  warm-started from the current state (``fedgp.fit(result.warm_spec(), grown, ...)``,
  ``--warm-rounds`` rounds), its owners conditioned on all their rows.

Times are wall-clock seconds per chunk, summed over the engines (one thread). Writes
results/benchmarks/cmapss_stream.csv (one row per chunk) with the command in its first line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "results" / "benchmarks" / "cmapss_stream.csv"


def scores(prediction, y: torch.Tensor) -> tuple[float, float]:
    """Summed squared error and summed Gaussian NLL of ``y`` under ``prediction`` (noisy variance)."""
    mean, var = prediction.mean.double(), prediction.variance_y.double()
    nll = 0.5 * (torch.log(2 * torch.pi * var) + (y - mean) ** 2 / var)
    return float(((y - mean) ** 2).sum()), float(nll.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sensor", default="s11")
    parser.add_argument("--engines", type=int, default=30)
    parser.add_argument("--start", type=int, default=50)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--warm-rounds", type=int, default=20)
    parser.add_argument("--refit-every", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    import fedgp
    from fedgp.data import ClientData, Federation
    from fedgp.datasets import load_cmapss

    if not os.environ.get("FEDGP_DATA"):
        raise SystemExit("set FEDGP_DATA to the folder holding cmapss/ (e.g. ../shared/datasets)")
    series = load_cmapss("FD001").federation(args.sensor, units=range(1, args.engines + 1), standardize=False)
    full = {c.id: c for c in series}
    start = Federation([ClientData(c.X[: args.start], c.y[: args.start], id=c.id) for c in series])
    spec, strategy = fedgp.GPSpec(), fedgp.strategies.FGPR()
    fitted = fedgp.fit(spec, start, strategy, rounds=args.rounds, engine="batched")
    updated, refitted = fitted, fitted  # the refitted result differs from the first refit on
    held = {c.id: args.start for c in series}
    position = {c.id: i for i, c in enumerate(series)}
    rows = []
    step = 0
    while True:
        live = [cid for cid in held if held[cid] < full[cid].n]
        if not live:
            break
        step += 1
        sums = {k: [0.0, 0.0] for k in ("fixed", "update", "refit")}
        points, gap, times = 0, 0.0, {"update": 0.0, "refit posterior": 0.0, "refit": 0.0}
        for cid in live:
            at = position[cid]  # unit numbers are ints: a result reads an int as a position
            lo, hi = held[cid], min(held[cid] + args.chunk, full[cid].n)
            X, y = full[cid].X[lo:hi], full[cid].y[lo:hi]
            first = ClientData(full[cid].X[: args.start], full[cid].y[: args.start], id=f"{cid}-first")
            forecasts = {
                "fixed": updated.posterior(X, client=first),  # the fitted θ on the first cycles alone
                "update": updated.posterior(X, client=at),
                "refit": refitted.posterior(X, client=at),
            }
            for name, prediction in forecasts.items():
                se, nll = scores(prediction, y)
                sums[name][0] += se
                sums[name][1] += nll
            began = time.perf_counter()  # the same posterior, built again on every row so far
            every = ClientData(full[cid].X[:lo], full[cid].y[:lo], id=f"{cid}-again")
            again = updated.posterior(X, client=every)
            times["refit posterior"] += time.perf_counter() - began
            gap = max(gap, float((again.mean - forecasts["update"].mean).abs().max()))
            points += hi - lo
            began = time.perf_counter()
            updated.update(at, X, y)
            times["update"] += time.perf_counter() - began
            if refitted is not updated:
                refitted.update(at, X, y)
            held[cid] = hi
        if step % args.refit_every == 0:
            began = time.perf_counter()
            grown = Federation([ClientData(full[c].X[: held[c]], full[c].y[: held[c]], id=c) for c in held])
            refitted = fedgp.fit(refitted.warm_spec(), grown, strategy, rounds=args.warm_rounds,
                                 engine="batched")  # fmt: skip
            times["refit"] += time.perf_counter() - began
        row = {"chunk": step, "engines": len(live), "points": points}
        for name, (se, nll) in sums.items():
            row[f"{name}_rmse"] = (se / points) ** 0.5
            row[f"{name}_nll"] = nll / points
        row.update({f"{k.replace(' ', '_')}_s": v for k, v in times.items()})
        row["update_vs_refit_posterior_max_diff"] = gap
        rows.append(row)
        print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = (
        "FEDGP_DATA=../shared/datasets PYTHONPATH=. .venv/bin/python benchmarks/cmapss_stream.py "
        + " ".join(sys.argv[1:])
    )
    with args.out.open("w") as handle:
        handle.write(f"# {command.strip()}\n")
        table.to_csv(handle, index=False, float_format="%.6g")
    totals = table[["update_s", "refit_posterior_s", "refit_s"]].sum()
    rmse = {k: round(float(np.mean(table[f"{k}_rmse"])), 4) for k in ("fixed", "update", "refit")}
    print(f"totals: update {totals.update_s:.2f} s, refit posterior {totals.refit_posterior_s:.2f} s, "
          f"refit {totals.refit_s:.2f} s; mean RMSE per chunk {rmse}")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
