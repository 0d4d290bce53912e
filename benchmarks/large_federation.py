"""Large owners: exact FGPR vs federated sparse variational GPs vs a centralised SVGP (issue 31, study a).

    .venv/bin/python benchmarks/large_federation.py                          # K = 20, n = 20,000 (≈ 30 min)
    .venv/bin/python benchmarks/large_federation.py --clients 4 --rows 2000  # a quick look
    .venv/bin/python benchmarks/large_federation.py --methods "centralised SVGP, M = 64"  # one method
                                                          # again: the CSV's other rows are kept

Data: one function on [0, 1]⁵, a draw from GP(0, RBF(ℓ = 0.4), outputscale 1) by 2,000 random
Fourier features, y = f(x) + ε with noise variance 0.01. K owners of n rows each, X uniform; every
owner also holds 200 test points. Methods, each in a fresh process (so that its peak RSS is its own),
every model a ``ScaleKernel(RBFKernel(ard_num_dims=5))``:

* ``exact FGPR``: :class:`fedgp.GPSpec`, FGPR (defaults) for R rounds, then every owner's exact
  personalised posterior on all its n rows (above 4,096 rows :mod:`fedgp.models.large`);
* ``federated SVGP, M = 64 / 256``: :class:`fedgp.VariationalGPSpec` (M inducing points, shared and
  averaged; each owner's q(u) its own), the same FGPR for R rounds;
* ``centralised SVGP, M = 64 / 256``: GPyTorch's own SVGP on the pooled K·n rows (the reference a
  federation of SVGPs approximates): whitened ``VariationalStrategy``, ``VariationalELBO``, Adam
  (lr 0.01) on everything for 1,000 minibatches of 1,024, inducing points started at the same Sobol
  set; outcomes standardised as fit does by default.

Reported: test RMSE, Gaussian NLL and 95 % coverage of y (means over owners, original units), the
training and the prediction wall time, the process's peak RSS.

Writes results/large_federation.csv and results/large_federation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
METHODS = [
    "exact FGPR",
    "federated SVGP, M = 64",
    "federated SVGP, M = 256",
    "centralised SVGP, M = 64",
    "centralised SVGP, M = 256",
]
D, FEATURES, LENGTHSCALE, NOISE, TEST = 5, 2000, 0.4, 0.01, 200


def owners(clients: int, rows: int, seed: int = 0):
    """Per owner (X, y, X_test, y_test) from one random-Fourier-feature draw of f."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((D, FEATURES)) / LENGTHSCALE
    b = rng.uniform(0, 2 * np.pi, FEATURES)
    w = rng.standard_normal(FEATURES) * math.sqrt(2.0 / FEATURES)

    def draw(m):
        X = rng.uniform(size=(m, D))
        return X, np.cos(X @ W + b) @ w + math.sqrt(NOISE) * rng.standard_normal(m)

    return [(*draw(rows), *draw(TEST)) for _ in range(clients)]


def kernel():
    import gpytorch

    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D))


def federated(method: str, parts, rounds: int) -> tuple[pd.DataFrame, float, float]:
    import fedgp
    from fedgp.data import ClientData, Federation
    from fedgp.run import Evaluate

    clients = [
        ClientData(X, y, id=f"owner{k}", X_test=Xt, y_test=yt) for k, (X, y, Xt, yt) in enumerate(parts)
    ]
    if method == "exact FGPR":
        spec = fedgp.GPSpec(kernel())
    else:
        spec = fedgp.VariationalGPSpec(int(method.rsplit("= ", 1)[1]), kernel(), input_dim=D)
    start = time.perf_counter()
    result = fedgp.fit(
        spec, Federation(clients), fedgp.strategies.FGPR(), rounds=rounds, seed=0,
        engine="sequential", callbacks=[Evaluate(every=0)],
    )  # fmt: skip
    trained = time.perf_counter() - start
    start = time.perf_counter()
    scores = result.evaluate()
    return scores, trained, time.perf_counter() - start


def centralised(
    parts, inducing: int, steps: int = 1000, batch: int = 1024
) -> tuple[pd.DataFrame, float, float]:
    """GPyTorch's SVGP on the pooled rows, scored on each owner's test points."""
    import gpytorch
    import torch

    X = torch.as_tensor(np.concatenate([p[0] for p in parts]))
    y = torch.as_tensor(np.concatenate([p[1] for p in parts]))
    offset, scale = float(y.mean()), float(y.std())
    y = (y - offset) / scale
    Z = torch.quasirandom.SobolEngine(D, scramble=True, seed=0).draw(inducing, dtype=torch.float64)

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            q = gpytorch.variational.CholeskyVariationalDistribution(len(Z))
            super().__init__(
                gpytorch.variational.VariationalStrategy(self, Z, q, learn_inducing_locations=True)
            )
            self.mean_module, self.covar_module = gpytorch.means.ZeroMean(), kernel()

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    model, likelihood = SVGP().double(), gpytorch.likelihoods.GaussianLikelihood().double()
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(y))
    optimizer = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.01)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    model.train(), likelihood.train()
    for _ in range(steps):
        idx = torch.randint(len(y), (batch,), generator=generator)
        optimizer.zero_grad()
        loss = -elbo(model(X[idx]), y[idx])
        loss.backward()
        optimizer.step()
    trained = time.perf_counter() - start
    start = time.perf_counter()
    model.eval(), likelihood.eval()
    rows = []
    with torch.no_grad():
        for k, (_, _, Xt, yt) in enumerate(parts):
            f = model(torch.as_tensor(Xt))
            mean = f.mean * scale + offset
            var = (f.variance + likelihood.noise) * scale**2
            yt = torch.as_tensor(yt)
            nll = 0.5 * (torch.log(2 * math.pi * var) + (yt - mean) ** 2 / var)
            inside = ((yt - mean).abs() <= 1.959964 * var.sqrt()).double()
            rows.append({"client": f"owner{k}", "rmse": float(((yt - mean) ** 2).mean().sqrt()),
                         "nll": float(nll.mean()), "coverage95": float(inside.mean())})  # fmt: skip
    return pd.DataFrame(rows), trained, time.perf_counter() - start


def worker(method: str, clients: int, rows: int, rounds: int) -> None:
    """One method, in this (fresh) process: prints a JSON line."""
    import torch

    torch.manual_seed(0)
    parts = owners(clients, rows)
    if method.startswith("centralised"):
        scores, trained, predicted = centralised(parts, int(method.rsplit("= ", 1)[1]))
    else:
        scores, trained, predicted = federated(method, parts, rounds)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({
        "method": method, "rmse": float(scores["rmse"].mean()), "nll": float(scores["nll"].mean()),
        "coverage95": float(scores["coverage95"].mean()), "train_s": trained, "predict_s": predicted,
        "peak_rss_gb": peak,
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args()
    rows = []
    for method in args.methods:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            method,
            str(args.clients),
            str(args.rows),
            str(args.rounds),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{method} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    out = Path(args.out)
    previous = out / "large_federation.csv"
    if set(args.methods) != set(METHODS) and previous.exists():  # a partial rerun keeps the other rows
        old = pd.read_csv(previous)
        same = (old["owners"] == args.clients) & (old["rows_per_owner"] == args.rows)
        old = old[same & ~old["method"].isin(args.methods)].drop(columns=["owners", "rows_per_owner"])
        frame = pd.concat([old, frame], ignore_index=True)
        frame = frame.iloc[frame["method"].map(METHODS.index).argsort()].reset_index(drop=True)
    frame.insert(0, "rows_per_owner", args.rows)
    frame.insert(0, "owners", args.clients)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "large_federation.csv", index=False, float_format="%.4g")
    default = (args.clients, args.rows, args.rounds) == (20, 20_000, 40)
    command = "`.venv/bin/python benchmarks/large_federation.py" + (
        "" if default else f" --clients {args.clients} --rows {args.rows} --rounds {args.rounds}"
    )
    if set(args.methods) != set(METHODS):
        command += " --methods " + " ".join(f'"{m}"' for m in args.methods)
    command += "`"
    text = [
        "# Large owners: exact FGPR, federated SVGPs, a centralised SVGP (issue 31, study a)",
        "",
        f"{command}: {args.clients} owners of {args.rows:,} rows (d = 5), {args.rounds} FGPR rounds, "
        "200 test points per owner; means over owners; a fresh process per method, torch's default "
        "threads (2 on the development machine).",
        "",
        frame.drop(columns=["owners", "rows_per_owner"]).to_markdown(index=False, floatfmt=".3f"),
        "",
    ]
    (out / "large_federation.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
