"""Federated GP classification with owners that differ (issue 31, study b).

    .venv/bin/python benchmarks/classification_owners.py              # 5 splits (≈ 5 min here)
    .venv/bin/python benchmarks/classification_owners.py --seeds 1    # a quick look

Data: scikit-learn's breast-cancer set (569 tumours, 212 malignant; it ships with scikit-learn),
its ten "mean" features. The tumours are split among 10 owners by deciles of one feature, the mean
texture, so that owners differ in what they see (the malignant share runs from about 10 % in the
lowest decile to about 60 % in the highest); each owner keeps 70 % of its tumours to train on and
30 % to test (a stratified split per owner, seeded). Label 1 = malignant.

Compared, on every owner's own test tumours:

* ``federated``: :class:`fedgp.VariationalGPSpec` (M = 32 inducing points, ``BernoulliLikelihood``,
  RBF with one lengthscale per feature) trained by FGPR (the defaults) for 60 rounds; each owner
  predicts with its own q(u);
* ``owner alone``: the same model fitted by each owner on its own tumours only (a one-owner
  federation, 60 rounds of the same local steps);
* ``centralised``: the same model on the pooled training tumours (one owner holding all of them);
* ``centralised (scikit-learn GPC)``: scikit-learn's ``GaussianProcessClassifier`` (Laplace,
  logistic link, RBF with one lengthscale per feature, its own optimiser) on the pooled, standardised
  training tumours — an independent implementation.

Metrics over all test tumours of a split: accuracy, Brier score, log-loss, and the expected
calibration error (ECE: 10 equal-width bins of the predicted probability, the bins' |accuracy −
confidence| weighted by their counts); and the worst owner's accuracy. Means over splits.

Writes results/classification_owners.csv (one row per split and method) and
results/classification_owners.md (the means).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd
import torch

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.run import Evaluate

ROOT = Path(__file__).resolve().parents[1]
OWNERS = 10
ROUNDS = 60
INDUCING = 32


def owners(seed: int) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], list[str]]:
    """Per owner (X_train, y_train, X_test, y_test), split by mean-texture deciles."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    data = load_breast_cancer()
    X, y = data.data[:, :10], (data.target == 0).astype(float)  # sklearn: 0 = malignant
    texture = X[:, list(data.feature_names).index("mean texture")]
    edges = np.quantile(texture, np.linspace(0, 1, OWNERS + 1)[1:-1])
    group = np.searchsorted(edges, texture, side="right")
    parts = []
    for k in range(OWNERS):
        Xk, yk = X[group == k], y[group == k]
        parts.append(train_test_split(Xk, yk, test_size=0.3, random_state=seed, stratify=yk))
    return [(a, c, b, d) for a, b, c, d in parts], list(data.feature_names[:10])


def spec() -> fedgp.VariationalGPSpec:
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=10))
    return fedgp.VariationalGPSpec(
        INDUCING, kernel, likelihood=gpytorch.likelihoods.BernoulliLikelihood(), input_dim=10
    )


def fitted(clients: list[ClientData], seed: int) -> fedgp.FitResult:
    return fedgp.fit(
        spec(),
        Federation(clients),
        fedgp.strategies.FGPR(),
        rounds=ROUNDS,
        seed=seed,
        engine="sequential",
        callbacks=[Evaluate(every=0)],
    )


def probabilities(result: fedgp.FitResult, client, X: np.ndarray) -> np.ndarray:
    return result.predict(X, client)[0].numpy()  # Bernoulli: the mean is P(y = 1)


def scores(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    q = np.clip(p, 1e-12, 1 - 1e-12)
    bins = np.minimum((p * 10).astype(int), 9)
    ece = sum(
        abs(
            float(((p[bins == b] > 0.5) == y[bins == b]).mean())
            - float(np.maximum(p, 1 - p)[bins == b].mean())
        )
        * (bins == b).mean()
        for b in range(10)
        if (bins == b).any()
    )
    return {
        "accuracy": float(((p > 0.5) == y).mean()),
        "brier": float(((p - y) ** 2).mean()),
        "log_loss": float(-(y * np.log(q) + (1 - y) * np.log(1 - q)).mean()),
        "ece": float(ece),
    }


def row(method: str, seed: int, per_owner: list[np.ndarray], parts, seconds: float) -> dict:
    p = np.concatenate(per_owner)
    y = np.concatenate([part[3] for part in parts])
    worst = min(float(((q > 0.5) == part[3]).mean()) for q, part in zip(per_owner, parts))
    return {"seed": seed, "method": method, **scores(p, y), "worst_owner_accuracy": worst, "seconds": seconds}


def one_split(seed: int) -> list[dict]:
    parts, _ = owners(seed)
    clients = [ClientData(a, b, id=f"owner{k}") for k, (a, b, _, _) in enumerate(parts)]
    rows = []
    start = time.perf_counter()
    result = fitted(clients, seed)
    federated = [probabilities(result, k, part[2]) for k, part in enumerate(parts)]
    rows.append(row("federated", seed, federated, parts, time.perf_counter() - start))
    start = time.perf_counter()
    alone = [probabilities(fitted([c], seed), 0, part[2]) for c, part in zip(clients, parts)]
    rows.append(row("owner alone", seed, alone, parts, time.perf_counter() - start))
    pooled = ClientData(
        np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), id="pooled"
    )
    start = time.perf_counter()
    central = fitted([pooled], seed)
    pooled_fit = [probabilities(central, 0, part[2]) for part in parts]
    rows.append(row("centralised", seed, pooled_fit, parts, time.perf_counter() - start))
    rows.append(sklearn_row(seed, parts))
    return rows


def sklearn_row(seed: int, parts) -> dict:
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel
    from sklearn.preprocessing import StandardScaler

    X = np.concatenate([p[0] for p in parts])
    scaler = StandardScaler().fit(X)
    start = time.perf_counter()
    gpc = GaussianProcessClassifier(ConstantKernel() * RBF(np.ones(10)), random_state=seed)
    gpc.fit(scaler.transform(X), np.concatenate([p[1] for p in parts]))
    per_owner = [gpc.predict_proba(scaler.transform(part[2]))[:, 1] for part in parts]
    return row("centralised (scikit-learn GPC)", seed, per_owner, parts, time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    frame = pd.DataFrame([r for seed in range(args.seeds) for r in one_split(seed)])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "classification_owners.csv", index=False)
    means = frame.groupby("method", sort=False).mean(numeric_only=True).drop(columns="seed")
    command = "`.venv/bin/python benchmarks/classification_owners.py" + (
        f" --seeds {args.seeds}`" if args.seeds != 5 else "`"
    )
    text = [
        "# Federated GP classification, owners split by a feature (issue 31, study b)",
        "",
        f"{command}; means over {args.seeds} splits (see the script's docstring for the data and methods).",
        "",
        means.to_markdown(floatfmt=".3f"),
        "",
    ]
    (out / "classification_owners.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
