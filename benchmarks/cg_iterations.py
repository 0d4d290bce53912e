"""How many conjugate-gradient iterations a large client's exact posterior takes, by lengthscale.

    .venv/bin/python benchmarks/cg_iterations.py            # n = 10⁴, ℓ ∈ {1, 0.6, 0.3, 0.15} (≈ 5 min)

:mod:`fedgp.models.iterative` solves a client's posterior by CG with a Nyström preconditioner of
``PRECONDITIONER_RANK`` (2,048) landmark rows. Its cost is (iterations) × n² kernel evaluations, and
the iterations depend on how much of the kernel matrix's spectrum above the noise the landmarks
capture: few for a smooth kernel, many for a short lengthscale in several dimensions. This measures
it on one client of n rows (d = 5, X uniform on the unit cube, y = Σ sin(3x) + noise), a
``ScaleKernel(RBF)`` with outputscale 1, noise variance 0.01 and every lengthscale ℓ, 200 test points:
CG iterations (mean with the first block of test points), seconds, and the largest difference from
the Cholesky posterior of :mod:`fedgp.models.large` (seconds beside it). One process, torch's threads.

Writes results/benchmarks/cg_iterations.csv.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fedgp  # noqa: E402
from fedgp.models import iterative, large  # noqa: E402
from fedgp.models.posterior import condition  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--lengthscales", type=float, nargs="+", default=[1.0, 0.6, 0.3, 0.15])
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "cg_iterations.csv"))
    args = parser.parse_args()
    runs: list[int] = []

    class Iterations(logging.Handler):
        def emit(self, record):
            runs.append(record.args[2])

    logging.getLogger(iterative.__name__).addHandler(Iterations())
    logging.getLogger(iterative.__name__).setLevel(logging.INFO)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(args.rows, 5, generator=g, dtype=torch.float64)
    y = torch.sin(3 * X).sum(1) + 0.1 * torch.randn(args.rows, generator=g, dtype=torch.float64)
    X_new = torch.rand(200, 5, generator=g, dtype=torch.float64)
    spec = fedgp.synthetic.gp_spec(5)
    rows = []
    for lengthscale in args.lengthscales:
        state = spec.state(
            {
                "likelihood.noise_covar.noise": 0.01,
                "covar_module.outputscale": 1.0,
                "covar_module.base_kernel.lengthscale": torch.full((1, 5), lengthscale),
            }
        )
        out = {}
        for path, threshold in (("cholesky", 10**12), ("iterative", 0)):
            iterative.ITERATIVE_CLIENT_ROWS = threshold
            runs.clear()
            start = time.perf_counter()
            out[path] = condition(spec, state, X, y, X_new, "large")
            out[f"{path}_s"] = time.perf_counter() - start
        rows.append(
            {
                "rows": args.rows,
                "lengthscale": lengthscale,
                "cg_iterations": "+".join(map(str, runs)),
                "iterative_s": out["iterative_s"],
                "cholesky_s": out["cholesky_s"],
                "max_abs_mean_diff": float((out["iterative"].mean - out["cholesky"].mean).abs().max()),
                "max_rel_var_diff": float(
                    ((out["iterative"].variance_f - out["cholesky"].variance_f) / out["cholesky"].variance_f)
                    .abs()
                    .max()
                ),
            }
        )
        print(rows[-1], flush=True)
    assert large.LARGE_CLIENT_ROWS < args.rows, "both paths need a client above LARGE_CLIENT_ROWS"
    frame = pd.DataFrame(rows)
    frame.to_csv(args.out, index=False, float_format="%.4g")
    print(frame.to_string(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
