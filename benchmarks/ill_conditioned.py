"""How far the engine paths agree when a minibatch's kernel matrix is at the edge of positive
definiteness, against the well-conditioned case the engine contract tests.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/ill_conditioned.py

FGPR (``small``: 4 local steps, minibatches of 8, 3 rounds; ``default``: ``FGPR()``, 5 rounds;
transforms off; the default local step, plain SGD at lr 0.3) on 3 clients of 20, 15 and 12 points
with an RBF kernel and a ``GreaterThan(floor)`` noise constraint, the noise starting at
max(1e-8, 10 floor), on three paths: ``sequential`` (GPyTorch), ``batched`` tensor path and
``batched`` compiled step. Cases: distinct inputs at a 1e-12 floor; every input duplicated (the
kernel matrix is then singular but for the noise) at the default floor 1e-4 and at 1e-6, 1e-8 and
1e-12, and with ``default`` at 1e-4 and 1e-12. Seeds 0-4. Writes
results/benchmarks/ill_conditioned.csv: per case, seed and path, the largest relative difference of
the final state from ``sequential``, and the client-rounds that failed on that path and on
``sequential`` (a local run that went off to non-finite values: that client sits the round out).
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


#: (inputs, noise floor, FGPR settings) of each case.
CASES = [
    ("distinct", 1e-12, "small"),
    *(("duplicated", floor, "small") for floor in (1e-4, 1e-6, 1e-8, 1e-12)),
    *(("duplicated", floor, "default") for floor in (1e-4, 1e-12)),
]


def spec(floor: float = 1e-12) -> fedgp.GPSpec:
    return fedgp.GPSpec(
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(floor)
        ),
        initial_values={"likelihood.noise_covar.noise": max(1e-8, 10 * floor)},
    )


def paths() -> dict[str, fedgp.engines.EngineConfig]:
    """The engine paths, ``sequential`` first (the compiled step where numba is installed)."""
    out = {"sequential": fedgp.engines.Sequential(), "batched tensor": fedgp.engines.Batched(compiled=False)}
    if compiled_step.available():
        out["batched compiled"] = fedgp.engines.Batched(compiled=True)
    return out


def differences(duplicated: bool, floor: float, seed: int, settings: str = "small") -> list[dict]:
    """Per path other than ``sequential``: the largest relative difference of its final state from
    ``sequential``'s, and the client-rounds that failed on each."""
    fed = federation(duplicated, seed)
    states, failed = {}, {}
    for name, engine in paths().items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            small = settings == "small"
            strategy = FGPR(local_steps=4, batch_size=8) if small else FGPR()
            result = fedgp.fit(
                spec(floor), fed, strategy, rounds=3 if small else 5, engine=engine, seed=1,
                transforms=None, callbacks=[fedgp.run.Progress(False)],
            )  # fmt: skip
        states[name], failed[name] = result.state, int(result.history["failed"].sum())
    reference = states.pop("sequential")
    return [
        dict(
            inputs="duplicated" if duplicated else "distinct",
            noise_floor=floor,
            fgpr=settings,
            seed=seed,
            path=name,
            max_rel_diff_vs_sequential=max(
                float(((state[key] - reference[key]).abs() / reference[key].abs()).max()) for key in reference
            ),
            failed_client_rounds=failed[name],
            sequential_failed_client_rounds=failed["sequential"],
        )  # fmt: skip
        for name, state in states.items()
    ]


def main() -> None:
    rows = []
    for inputs, floor, settings in CASES:
        for seed in range(5):
            rows += differences(inputs == "duplicated", floor, seed, settings)
            print(*rows[-2:], sep="\n")
    table = pd.DataFrame(rows)
    table.to_csv(OUT, index=False)
    summary = table.groupby(["inputs", "noise_floor", "fgpr", "path"], sort=False)
    print(summary["max_rel_diff_vs_sequential"].agg(["median", "max"]))
    print(summary[["failed_client_rounds", "sequential_failed_client_rounds"]].sum())


if __name__ == "__main__":
    main()
