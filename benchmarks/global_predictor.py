"""A global predictor from local experts (issue 31, study c): points that no owner holds.

    .venv/bin/python benchmarks/global_predictor.py               # 5 seeds, both layouts (≈ 2 min)
    .venv/bin/python benchmarks/global_predictor.py --seeds 1     # a quick look

Data: y = f(x) + ε on [0, 1]², f a draw from GP(0, RBF(ℓ = 0.2)) by 2,000 random Fourier features
(outputscale 1), noise variance 0.01. K = 8 owners, 150 points each, each owning a strip of the first
input (owners differ in *where* their data lie, as plants, regions or patients do). Two layouts:

* ``between``: the strips tile [0, 1]; the 500 test points are fresh uniform points (between the
  owners' own points, and across strip borders).
* ``gap``: the strips tile [0, 0.35] ∪ [0.65, 1]; the test points lie in the gap no owner covers.

FGPR (the defaults, 40 rounds) learns the shared hyper-parameters; then the server asks every owner
for its posterior mean and variance at the test points and combines them (``result.posterior(X,
combine=rule)``, :mod:`fedgp.models.experts`). Compared with: the shared prior alone (what a user
had before: no owner's data), one exact GP on the pooled data under the same learned
hyper-parameters (``centralised, FGPR θ``: the shared prior conditioned on every row, what the
experts approximate), and a centralised exact GP with its own type-II ML hyper-parameters
(:class:`fedgp.baselines.CentralGP`, the reference a federation cannot beat). Metrics on y: RMSE, the
Gaussian NLL per point, the 95 % interval's coverage; means over seeds.

Writes results/global_predictor.csv (one row per layout, method and seed) and
results/global_predictor.md (the means).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import fedgp
from fedgp.data import ClientData, Federation

ROOT = Path(__file__).resolve().parents[1]
OWNERS, PER_OWNER, TEST, NOISE = 8, 150, 500, 0.01
RULES = ("poe", "gpoe", "bcm", "rbcm")


def draw(layout: str, seed: int):
    """The owners' federation and the test set of one layout and seed."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((2, 2000)) / 0.2
    b = rng.uniform(0, 2 * np.pi, 2000)
    amp = np.sqrt(2 / 2000) * rng.standard_normal(2000)

    def f(X):
        return np.cos(X @ W + b) @ amp

    if layout == "between":
        edges = np.linspace(0, 1, OWNERS + 1)
        strips = list(zip(edges[:-1], edges[1:]))
        test_x1 = rng.uniform(0, 1, TEST)
    else:
        left, right = np.linspace(0, 0.35, OWNERS // 2 + 1), np.linspace(0.65, 1, OWNERS // 2 + 1)
        strips = [*zip(left[:-1], left[1:]), *zip(right[:-1], right[1:])]
        test_x1 = rng.uniform(0.35, 0.65, TEST)
    clients = []
    for k, (lo, hi) in enumerate(strips):
        X = np.column_stack([rng.uniform(lo, hi, PER_OWNER), rng.uniform(0, 1, PER_OWNER)])
        clients.append(ClientData(X, f(X) + np.sqrt(NOISE) * rng.standard_normal(PER_OWNER), id=f"owner{k}"))
    Xt = np.column_stack([test_x1, rng.uniform(0, 1, TEST)])
    yt = f(Xt) + np.sqrt(NOISE) * rng.standard_normal(TEST)
    return Federation(clients), torch.from_numpy(Xt), torch.from_numpy(yt)


def row(layout, seed, method, pred: fedgp.models.Prediction, y, seconds) -> dict:
    metrics = fedgp.models.posterior.prediction_metrics([pred], [y])
    return {
        "layout": layout,
        "seed": seed,
        "method": method,
        "rmse": float(metrics["rmse"][0]),
        "nll": float(metrics["nll"][0]),
        "coverage95": float(metrics["coverage95"][0]),
        "seconds": seconds,
    }


def study(layout: str, seed: int, rounds: int) -> list[dict]:
    fed, Xt, yt = draw(layout, seed)
    spec = fedgp.synthetic.gp_spec(2, "rbf")
    result = fedgp.fit(spec, fed, fedgp.strategies.FGPR(), rounds=rounds, seed=seed)
    rows = []
    for rule in RULES:
        start = time.perf_counter()
        pred = result.posterior(Xt, combine=rule)
        rows.append(row(layout, seed, rule, pred, yt, time.perf_counter() - start))
    mean, variance = fedgp.run.combined.shared_prior(result, Xt)
    noise = float(result.state["likelihood.noise_covar.noise"]) * float(result.transform.y_scale) ** 2
    rows.append(
        row(layout, seed, "shared prior", fedgp.models.Prediction(mean, variance, variance + noise), yt, 0.0)
    )
    pooled = ClientData(torch.cat([c.X for c in fed]), torch.cat([c.y for c in fed]), id="pooled")
    start = time.perf_counter()
    pred = result.posterior(Xt, pooled)
    rows.append(row(layout, seed, "centralised, FGPR θ", pred, yt, time.perf_counter() - start))
    start = time.perf_counter()
    central = fedgp.baselines.CentralGP(spec, hyper_subset=None).fit(fed)
    p = central.predict_pooled(Xt)
    s = central.std_
    pred = fedgp.models.Prediction(p.mean * s + central.mean_, p.variance_f * s * s, p.variance_y * s * s)
    rows.append(row(layout, seed, "centralised, own ML θ", pred, yt, time.perf_counter() - start))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for layout in ("between", "gap"):
        for seed in range(args.seeds):
            rows += study(layout, seed, args.rounds)
            print(pd.DataFrame(rows[-7:]).to_string(index=False), flush=True)
    frame = pd.DataFrame(rows)
    out = ROOT / "results" / "global_predictor.csv"
    frame.to_csv(out, index=False, float_format="%.6g")
    order = {
        m: i for i, m in enumerate([*RULES, "shared prior", "centralised, FGPR θ", "centralised, own ML θ"])
    }
    means = frame.groupby(["layout", "method"], sort=False)[["rmse", "nll", "coverage95", "seconds"]].mean()
    means = means.reset_index().sort_values(
        ["layout", "method"], key=lambda c: c.map(order) if c.name == "method" else c
    )
    command = f".venv/bin/python benchmarks/global_predictor.py --seeds {args.seeds} --rounds {args.rounds}"
    text = (
        f"# A global predictor from local experts\n\nCommand: `{command}` (means over {args.seeds} seeds; "
        f"per-seed rows in global_predictor.csv)\n\n{means.to_markdown(index=False, floatfmt='.4g')}\n"
    )
    (ROOT / "results" / "global_predictor.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
