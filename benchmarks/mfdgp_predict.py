"""MF-DGP prediction: time and peak memory against the chunk of test points, and the dense link
kernel against gpytorch's own composition (fresh process per configuration).

    .venv/bin/python benchmarks/mfdgp_predict.py                  # PARK, 30 problems, 200 points
    .venv/bin/python benchmarks/mfdgp_predict.py --problems 4     # quick

Table 1 predicts 30 repeats at once (``MFDGP.fit_batch``), 1,000 test points, 250 Monte Carlo
samples per point. Each configuration fits PARK's repeats with a token schedule (one Adam step per
stage, 5 L-BFGS iterations per exact start: the prediction's cost does not depend on how well the
model fits), then times ``predict_batch`` alone. ``link="composed"`` builds the link kernel as
``k_rho * (k_f + linear) + k_delta`` with gpytorch's operators, which multiply square blocks as a
MulLinearOperator and add the linear kernel as a low-rank update; ``"dense"`` is fedgp's
(fedgp.baselines.mfdgp._DenseSum/_DenseProduct), whose entries are identical
(tests/baselines/test_mfdgp.py). The default chunk is the one Table 1 ran with.

Writes results/benchmarks/mfdgp_predict.csv (link, chunk, problems, points, predict_s,
ms_per_point, peak_rss_gb); peak RSS covers the fit too, which needs less than the prediction.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's fedgp (also in the worker processes)


def worker(link: str, chunk: int | None, problems: int, points: int) -> dict:
    import warnings

    import gpytorch
    import torch

    torch.set_num_threads(1)
    from fedgp.baselines import mfdgp
    from fedgp.experiments.table1 import Protocol
    from fedgp.synthetic.multifidelity import multifidelity_federation

    if link == "composed":

        def composed(d, batch, floor=None):
            kw = mfdgp._lengthscale(floor)
            rbf = gpytorch.kernels.RBFKernel(active_dims=(d,), batch_shape=batch, **kw)
            k_f = gpytorch.kernels.ScaleKernel(rbf, batch_shape=batch)
            linear = gpytorch.kernels.LinearKernel(active_dims=(d,), batch_shape=batch)
            return mfdgp._x_kernel(d, batch, floor) * (k_f + linear) + mfdgp._x_kernel(d, batch, floor)

        mfdgp._link_kernel = composed
    seeds = list(range(problems))
    fed = [multifidelity_federation("park", None, n_test=points, seed=s) for s in seeds]
    model = replace(Protocol(), mfdgp_steps=(1, 1, 1)).mfdgp(0)
    model.start_iterations = 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit_batch([p.levels for p in fed], seeds=seeds)
        start = time.perf_counter()
        model.predict_batch([p.X_test for p in fed], chunk=chunk)
        seconds = time.perf_counter() - start
    if chunk is None:
        m = max(layer.variational_strategy.inducing_points.shape[-2] for layer in model.net_.layers)
        chunk = max(1, int(2e7 // (model.predict_samples * problems * m)))
    return {
        "link": link,
        "chunk": chunk,
        "problems": problems,
        "points": points,
        "predict_s": round(seconds, 2),
        "ms_per_point": round(1e3 * seconds / points, 1),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=30)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--chunks", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "mfdgp_predict.csv")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        link, chunk, problems, points = args.worker
        chunk_value = None if chunk == "default" else int(chunk)
        print(json.dumps(worker(link, chunk_value, int(problems), int(points))))
        return
    import pandas as pd

    configs = [("composed", "default"), ("dense", "default")] + [("dense", str(c)) for c in args.chunks]
    rows = []
    for link, chunk in configs:
        cmd = [sys.executable, __file__, "--worker", link, chunk, str(args.problems), str(args.points)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
