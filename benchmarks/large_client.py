"""Personalised prediction for a client with many rows: time and peak memory (issue 31, item 1).

    .venv/bin/python benchmarks/large_client.py                       # n = 10⁴, 3·10⁴, 10⁵ (≈ 20 min)
    .venv/bin/python benchmarks/large_client.py --sizes 10000 --paths large   # a quick look
    .venv/bin/python benchmarks/large_client.py --sizes 10000 30000 100000 --paths large svgp \
        --out results/benchmarks/large_client_svgp.csv    # the sparse variational GP beside it
    .venv/bin/python benchmarks/large_client.py --rounds 20 --paths large iterative \
        --out results/benchmarks/large_client_trained.csv   # nearly trained hyper-parameters

The case of the issue: one client of n rows (d = 5) among four of 200, FGPR (defaults) for 3 rounds
(``--rounds``; at 3 the noise is still 0.53, at 20 it is 0.03 and the linear systems are harder),
then ``result.predict`` of 200 new points for the large client. Each (n, path) runs in a fresh
process, so its peak RSS is its own: ``large`` is fedgp's default above
``fedgp.models.large.LARGE_CLIENT_ROWS`` rows (the exact posterior in one n×n matrix up to
``fedgp.models.iterative.ITERATIVE_CLIENT_ROWS`` rows or what free memory holds, preconditioned
conjugate gradients above), ``iterative`` the conjugate gradients at any size, ``gpytorch`` the exact
GPyTorch prediction every client took before (the thresholds raised out of reach), ``svgp`` a
:class:`fedgp.VariationalGPSpec` of 256 inducing points instead of the exact GP (its own 3 FGPR
rounds). ``solver`` says which solve ran, ``cg_iterations`` the iterations of each CG run (the mean
goes with the first block of test points). Where a Cholesky answer (``large`` at a size it factorises,
or ``gpytorch``) and another path both ran, the largest differences of their means and (relative)
variances are reported: round-off for ``gpytorch``, the solver's tolerance for ``iterative``, the
approximation's distance from the exact posterior for ``svgp``.

Writes results/benchmarks/large_client.csv (n, path, predict_s, peak_rss_gb, rss_before_gb,
max_abs_mean_diff, max_rel_var_diff, note).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "results" / "benchmarks" / "large_client.csv"
SVGP_INDUCING = 256


def worker(n: int, path: str, save: str, rounds: int) -> None:
    """One measurement, in this (fresh) process: prints a JSON line."""
    import torch

    import fedgp
    from fedgp.data import ClientData, Federation
    from fedgp.models import iterative, large

    runs = []

    class Iterations(logging.Handler):
        def emit(self, record):
            runs.append(record.args[2])

    logging.getLogger(iterative.__name__).addHandler(Iterations())
    logging.getLogger(iterative.__name__).setLevel(logging.INFO)

    torch.manual_seed(0)
    rng = np.random.default_rng(0)

    def draw(rows):
        X = rng.uniform(size=(rows, 5))
        return X, np.sin(3 * X).sum(1) + 0.1 * rng.standard_normal(rows)

    clients = [ClientData(*draw(n), id="large")] + [ClientData(*draw(200), id=f"small{k}") for k in range(4)]
    spec = fedgp.synthetic.gp_spec(5)
    if path == "svgp":
        spec = fedgp.VariationalGPSpec(SVGP_INDUCING, spec.kernel, input_dim=5)
    result = fedgp.fit(spec, Federation(clients), fedgp.strategies.FGPR(), rounds=rounds, seed=0)
    X_new = rng.uniform(size=(200, 5))
    if path == "gpytorch":
        large.LARGE_CLIENT_ROWS = iterative.ITERATIVE_CLIENT_ROWS = 10**12
    if path == "iterative":
        iterative.ITERATIVE_CLIENT_ROWS = 0
    if path in ("large", "iterative"):
        chosen = path == "iterative" or n > iterative.ITERATIVE_CLIENT_ROWS or not large.fits_in_memory(n)
        solver = "conjugate gradients" if chosen else "cholesky, one n×n matrix"
    else:
        solver = {"gpytorch": "gpytorch exact", "svgp": "svgp"}[path]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    start = time.perf_counter()
    try:
        mean, variance = result.predict(X_new, "large")
        note = ""
    except Exception as err:  # noqa: BLE001 - the refusal is the measurement
        mean = variance = None
        note = f"{type(err).__name__}: {err}"
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if mean is not None:
        np.save(save, np.stack([mean.numpy(), variance.numpy()]))
    iterations = "+".join(map(str, runs))
    print(
        json.dumps(
            {
                "solver": solver,
                "predict_s": seconds,
                "peak_rss_gb": peak,
                "rss_before_gb": before,
                "cg_iterations": iterations,
                "note": note,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--paths", nargs="+", default=["large", "iterative", "gpytorch"])
    parser.add_argument("--gpytorch-max", type=int, default=30_000, help="largest n run on the GPyTorch path")
    parser.add_argument(
        "--rounds", type=int, default=3, help="FGPR rounds before predicting (20: nearly trained, noise 0.03)"
    )
    parser.add_argument("--out", default=str(OUT), help="the CSV to write")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in args.sizes:
            saved = {}
            for path in args.paths:
                if path == "gpytorch" and n > args.gpytorch_max or path == "iterative" and n > 40_000:
                    continue  # GPyTorch's exact path beyond memory; the large path iterates there anyway
                save = str(Path(folder) / f"{n}_{path}.npy")
                cmd = [sys.executable, __file__, "--worker", str(n), path, save, str(args.rounds)]
                done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
                row = {
                    "n": n,
                    "rounds": args.rounds,
                    "path": path,
                    **json.loads(done.stdout.strip().splitlines()[-1]),
                }
                if Path(save).exists():
                    saved[path] = np.load(save)
                rows.append(row)
                print(row, flush=True)
            here = [row for row in rows if row["n"] == n]
            reference = "gpytorch" if "gpytorch" in saved else "large"
            exact = {"gpytorch exact", "cholesky, one n×n matrix"}
            if reference in saved and any(r["path"] == reference and r["solver"] in exact for r in here):
                a = saved[reference]
                for row in here:
                    if row["path"] in saved and row["path"] != reference:
                        b = saved[row["path"]]
                        row["max_abs_mean_diff"] = float(np.abs(a[0] - b[0]).max())
                        row["max_rel_var_diff"] = float((np.abs(a[1] - b[1]) / a[1]).max())
                        row["against"] = reference
    frame = pd.DataFrame(rows)
    columns = [
        "n",
        "rounds",
        "path",
        "solver",
        "predict_s",
        "peak_rss_gb",
        "rss_before_gb",
        "max_abs_mean_diff",
        "max_rel_var_diff",
        "against",
        "cg_iterations",
    ]
    frame = frame.reindex(columns=[*columns, "note"])
    frame.to_csv(args.out, index=False, float_format="%.4g")
    print(frame.to_string(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
