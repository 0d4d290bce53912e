"""The compiled GP step of one tile (``fedgp.engines.compiled.tile_nll``) under three builds.

    .venv/bin/python benchmarks/tile_kernel.py            # ≈ 1 min
    .venv/bin/python benchmarks/tile_kernel.py --repeats 9

One tile = TILE (8) clients' minibatch NLL and gradients, M = 32 points, d = 5, on one thread:

* ``fedgp``: the package's build (LLVM's SLP vectoriser on, its loop vectoriser off, the
  exponent's argument clamped at -708, L⁻¹ row by row);
* ``loop vectoriser on``: the same source with LLVM's loop vectoriser left on (numba's default);
* ``select after exp``: the exponent's result selected per lane (``e if x > -708 else 0``) instead
  of its argument clamped, L⁻¹ column by column, loop vectoriser on: the kernel as it was before
  issue 34's item 3.

``--sections`` adds the package's build stopped after each section (Gram matrix, Cholesky,
L⁻¹, K⁻¹, α and the NLL; the full build adds the gradients): cumulative times, so differences are
what each section costs. Each build is compiled afresh (no numba cache) and timed over ``--calls``
calls, ``--repeats`` times; the table gives the median µs per tile, per client-step, and GFLOP/s at
the engine benchmarks' 59 kFLOP per client-step. Writes results/benchmarks/tile_kernel.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgp.engines import compiled  # noqa: E402

FLOP_PER_CLIENT_STEP = 59e3  # benchmarks/engine_throughput.py's count for M = 32, d = 5
CLAMP = "            x@ = max(x@, -708.0)\n"
#: Where the template's sections start, and the section each return stops after (``--sections``).
SECTIONS = [
    ("    # Cholesky K = LL^T", "Gram matrix"),
    ("    # L^-1 in place", "Cholesky"),
    ("    # K^-1 = L^-T", "L^-1"),
    ("    # alpha = K^-1 r", "K^-1"),
    ("    if not need_grad:", "alpha and NLL"),
]
#: L⁻¹ column by column, as before issue 34's item 3 (the package's is row by row).
COLUMN_INVERSE = """    for j in range(M):
        L[j, j, @] = 1.0 / L[j, j, @]
        for i in range(j + 1, M):
            c@ = L[i, j, @] * L[j, j, @]
            for k in range(j + 1, i):
                c@ += L[i, k, @] * L[k, j, @]
            L[i, j, @] = -c@ / L[i, i, @]
"""
SELECT = ("e@ = e@ * scale[@] * v@\n", "e@ = e@ * scale[@] * v@ if x@ > -708.0 else 0.0\n")


def main() -> None:
    import numba

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument(
        "--sections", action="store_true", help="also time the package's build stopped after each section"
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "tile_kernel.csv"))
    args = parser.parse_args()
    source = compiled._TILE_NLL
    assert CLAMP in source and SELECT[0] in source, "the template changed: update this benchmark"
    start = source.index("    for i in range(M):\n        L[i, i, @] = 1.0")
    end = source.index("    # K^-1 = L^-T")
    before = (source[:start] + COLUMN_INVERSE + source[end:]).replace(CLAMP, "").replace(*SELECT)
    builds = {
        "fedgp": (source, False),
        "loop vectoriser on": (source, True),
        "select after exp": (before, True),
    }
    if args.sections:  # the package's build returning after each section: cumulative times
        for marker, section in SECTIONS:
            assert marker in source, f"the template changed: no {marker!r}"
            builds[f"up to {section}"] = (source.replace(marker, "    return\n" + marker, 1), False)
    M, d, T = 32, 5, compiled.TILE
    rng = np.random.default_rng(0)
    rows = []
    for nu_code, kernel in ((0, "rbf"), (2, "matern52")):
        for name, (src, loop_vectorize) in builds.items():
            scratch = compiled.kernels().scratch(M, d, np.zeros(1))
            L, U, E, out, al, gz, z, rr, valid, nf, sv, nv = scratch
            z[:] = rng.normal(size=z.shape) * 0.5
            rr[:] = rng.normal(size=rr.shape)
            valid[:], nf[:], sv[:], nv[:] = 1.0, M, 1.0, 0.1
            jit = numba.njit(fastmath=compiled.FASTMATH, error_model="numpy", nogil=True)  # no cache
            fn = compiled._lanes_function("tile_nll", src, jit)
            call = (z, rr, valid, nf, sv, nv, M, d, nu_code, True, L, U, E, out, al, gz)
            previous = numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE
            numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE = 1, int(loop_vectorize)
            try:
                fn(*call)  # compiles with these settings
            finally:
                numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE = previous
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn(*call)
                times.append((time.perf_counter() - start) / args.calls)
            tile = statistics.median(times)
            rows.append({
                "kernel": kernel, "build": name, "us_per_tile": tile * 1e6,
                "us_per_client_step": tile / T * 1e6,
                "gflops": float("nan") if name.startswith("up to") else FLOP_PER_CLIENT_STEP * T / tile / 1e9,
            })  # fmt: skip
            print(f"{kernel:9s} {name:24s} {tile * 1e6:7.1f} µs/tile {tile / T * 1e6:6.2f} µs/client-step "
                  f"{rows[-1]['gflops']:5.2f} GFLOP/s")  # fmt: skip
    import pandas as pd

    frame = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False, float_format="%.4g")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
