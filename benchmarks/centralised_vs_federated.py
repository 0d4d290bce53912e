"""Centralised exact GP (GPyTorch, the user's alternative) vs FGPR on the same pooled data.

    .venv/bin/python benchmarks/centralised_vs_federated.py               # N = 20,000, d = 5, K = 100
    .venv/bin/python benchmarks/centralised_vs_federated.py --n-total 5000 --iters 20   # a quick look

Data: y = f(x) + ε on [0, 1]^5, f a draw from GP(0, RBF(ℓ = 0.5)) by 4,000 random Fourier features
(outputscale 1), noise variance 0.1; N training points split IID over K = 100 clients, and 20 test
points per client (2,000 in all).

* Centralised: a GPyTorch ``ExactGP`` on all N points, trained as in GPyTorch's regression tutorial
  (Adam, lr 0.1, ``--iters`` iterations, GPyTorch's default settings, which above 800 points use
  CG/Lanczos rather than Cholesky), in float32 by default (the tutorial's dtype; float64 needs
  ~3.2 GB per 20,000² matrix and several of them). Test predictions condition on all N points.
* FGPR: ``engine="batched"``, E = 5 Adam steps of M = 64 per round, ``--rounds`` rounds, float64.
  Its test predictions are reported twice: each client conditioning on its own 200 points (the
  federated deployment), and the learned θ conditioned on all N points (to compare the
  hyper-parameters themselves with the centralised fit).

Writes results/benchmarks/centralised_vs_federated.csv and prints the table.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]


def make_data(n_total: int, n_test: int, d: int, seed: int):
    rng = np.random.default_rng(seed)
    features, lengthscale, outputscale, noise = 4000, 0.5, 1.0, 0.1
    W = rng.standard_normal((d, features)) / lengthscale
    b = rng.uniform(0, 2 * np.pi, features)
    amp = np.sqrt(2 * outputscale / features) * rng.standard_normal(features)

    def f(X):
        return np.cos(X @ W + b) @ amp

    X = rng.uniform(size=(n_total + n_test, d))
    y = f(X) + np.sqrt(noise) * rng.standard_normal(len(X))
    return X[:n_total], y[:n_total], X[n_total:], y[n_total:]


def gaussian_metrics(mean, var, y):
    mean, var, y = (np.asarray(a, dtype=np.float64) for a in (mean, var, y))
    rmse = float(np.sqrt(np.mean((mean - y) ** 2)))
    nll = float(np.mean(0.5 * (np.log(2 * np.pi * var) + (y - mean) ** 2 / var)))
    return rmse, nll


def centralised(X, y, Xt, yt, iters: int, dtype):
    import gpytorch

    class ExactGPModel(gpytorch.models.ExactGP):
        def __init__(self, train_x, train_y, likelihood):
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=X.shape[1])
            )

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    tx, ty = torch.as_tensor(X, dtype=dtype), torch.as_tensor(y, dtype=dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(tx, ty, likelihood).to(dtype)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    start = time.perf_counter()
    for _ in range(iters):
        optimizer.zero_grad()
        loss = -mll(model(tx), ty)
        loss.backward()
        optimizer.step()
    train_s = time.perf_counter() - start
    model.eval()
    start = time.perf_counter()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        pred = likelihood(model(torch.as_tensor(Xt, dtype=dtype)))
        mean, var = pred.mean.numpy(), pred.variance.numpy()
    predict_s = time.perf_counter() - start
    theta = {
        "outputscale": float(model.covar_module.outputscale.detach()),
        "noise": float(likelihood.noise.detach()),
        "lengthscale_mean": float(model.covar_module.base_kernel.lengthscale.detach().mean()),
    }
    return train_s, predict_s, gaussian_metrics(mean, var, yt), theta


def federated(X, y, Xt, yt, clients: int, rounds: int, seed: int):
    import fedgp
    from fedgp.data import ClientData, Federation, IidPartitioner

    parts = IidPartitioner(clients, seed=seed)(len(X))
    test_parts = np.array_split(np.arange(len(Xt)), clients)
    fed = Federation(
        ClientData(X[p], y[p], id=k, X_test=Xt[tp], y_test=yt[tp])
        for k, (p, tp) in enumerate(zip(parts, test_parts))
    )
    spec = fedgp.synthetic.gp_spec(X.shape[1], "rbf")
    strategy = fedgp.strategies.FGPR.authors(local_steps=5, batch_size=64, lr=0.05)
    start = time.perf_counter()
    result = fedgp.fit(
        spec,
        fed,
        strategy,
        engine="batched",
        rounds=rounds,
        seed=seed,
        callbacks=[fedgp.run.Evaluate(every=0)],
    )
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    local = result.evaluate()  # batched personalised posteriors, each client on its own data
    predict_s = time.perf_counter() - start
    # per-point metrics over all test points (clients hold equal test counts)
    local_rmse = float(np.sqrt(np.mean(local["rmse"] ** 2)))
    local_nll = float(local["nll"].mean())
    state = result.state
    theta = {
        "outputscale": float(state["covar_module.outputscale"]),
        "noise": float(state["likelihood.noise_covar.noise"]),
        "lengthscale_mean": float(state["covar_module.base_kernel.lengthscale"].mean()),
    }
    pooled = fedgp.models.condition(spec, state, torch.as_tensor(X), torch.as_tensor(y), torch.as_tensor(Xt))
    pooled_metrics = gaussian_metrics(pooled.mean.numpy(), pooled.variance_y.numpy(), yt)
    return train_s, predict_s, (local_rmse, local_nll), pooled_metrics, theta


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-total", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--d", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50, help="centralised Adam iterations")
    parser.add_argument("--rounds", type=int, default=100, help="FGPR rounds")
    parser.add_argument("--central-dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", default=str(ROOT / "results" / "benchmarks" / "centralised_vs_federated.csv")
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n_test = 20 * args.clients
    X, y, Xt, yt = make_data(args.n_total, n_test, args.d, args.seed)

    f_train, f_pred, (f_rmse, f_nll), (p_rmse, p_nll), f_theta = federated(
        X, y, Xt, yt, args.clients, args.rounds, args.seed
    )
    c_train, c_pred, (c_rmse, c_nll), c_theta = centralised(
        X, y, Xt, yt, args.iters, getattr(torch, args.central_dtype)
    )
    rows = [
        {
            "method": f"centralised GPyTorch ExactGP ({args.central_dtype}, {args.iters} Adam iters)",
            "train_s": c_train,
            "predict_s": c_pred,
            "test_rmse": c_rmse,
            "test_nll": c_nll,
            **c_theta,
        },
        {
            "method": f"FGPR batched, K={args.clients}, {args.rounds} rounds: local conditioning",
            "train_s": f_train,
            "predict_s": f_pred,
            "test_rmse": f_rmse,
            "test_nll": f_nll,
            **f_theta,
        },
        {
            "method": "FGPR hyper-parameters, pooled conditioning (not federated)",
            "train_s": f_train,
            "predict_s": math.nan,
            "test_rmse": p_rmse,
            "test_nll": p_nll,
            **f_theta,
        },
    ]
    table = pd.DataFrame(rows)
    table.insert(1, "N", args.n_total)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False, float_format="%.4g")
    with pd.option_context("display.width", 200, "display.max_colwidth", 80):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(
        f"\ntraining speed-up FGPR vs centralised: {c_train / f_train:.1f}x; "
        f"test RMSE ratio (local conditioning / centralised): {f_rmse / c_rmse:.3f}; "
        f"(FGPR θ with pooled conditioning / centralised): {p_rmse / c_rmse:.3f}"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
