"""How far the engine paths agree when a minibatch's kernel matrix is at the edge of positive
definiteness, against the well-conditioned case the engine contract tests.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/ill_conditioned.py

FGPR (4 local steps, minibatches of 8, 3 rounds, transforms off) on 3 clients of 20, 15 and 12
points with an RBF kernel and a ``GreaterThan(1e-12)`` noise floor starting at 1e-8, on three
paths: ``sequential`` (GPyTorch), ``batched`` tensor path and ``batched`` compiled step. Cases:
distinct inputs; every input duplicated (the kernel matrix is then singular but for the noise, so
whether a path's Cholesky needs GPyTorch's jitter depends on its own rounding). Seeds 0-4. Writes
results/benchmarks/ill_conditioned.csv: per case, seed and path, the largest relative difference of
the final state from ``sequential``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.engines import compiled as compiled_step
from fedgp.strategies import FGPR

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "ill_conditioned.csv"


def federation(duplicated: bool, seed: int) -> Federation:
    rng = np.random.default_rng(seed)
    clients = []
    for i, n in enumerate((20, 15, 12)):
        X = rng.uniform(size=((n + 1) // 2 if duplicated else n, 2))
        if duplicated:
            X = np.concatenate([X, X])[:n]
        y = np.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * rng.normal(size=len(X))
        clients.append(ClientData(X, y, id=f"c{i}"))
    return Federation(clients)


def spec() -> fedgp.GPSpec:
    return fedgp.GPSpec(
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(1e-12)
        ),
        initial_values={"likelihood.noise_covar.noise": 1e-8},
    )


def main() -> None:
    paths = {"batched tensor": fedgp.engines.Batched(compiled=False)}
    if compiled_step.available():
        paths["batched compiled"] = fedgp.engines.Batched(compiled=True)
    rows = []
    for duplicated in (False, True):
        for seed in range(5):
            fed = federation(duplicated, seed)
            states = {}
            for name, engine in {"sequential": fedgp.engines.Sequential(), **paths}.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = fedgp.fit(
                        spec(), fed, FGPR(local_steps=4, batch_size=8), rounds=3, engine=engine, seed=1,
                        transforms=None, callbacks=[fedgp.run.Progress(False)],
                    )  # fmt: skip
                states[name] = result.state
            reference = states.pop("sequential")
            for name, state in states.items():
                worst = max(
                    float(((state[key] - reference[key]).abs() / reference[key].abs()).max())
                    for key in reference
                )
                rows.append(dict(inputs="duplicated" if duplicated else "distinct", seed=seed, path=name,
                                 max_rel_diff_vs_sequential=worst))  # fmt: skip
                print(rows[-1])
    table = pd.DataFrame(rows)
    table.to_csv(OUT, index=False)
    print(table.groupby(["inputs", "path"])["max_rel_diff_vs_sequential"].agg(["median", "max"]))


if __name__ == "__main__":
    main()
