"""Where ``stop="auto"`` ends the README's ten-line example, and how that compares with a long run.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/stopping_auto.py

FGPR's default and the authors' settings (``FGPR.authors(local_steps=5, batch_size=32, lr=0.05)``:
Adam reset every round on minibatches of 32) on 20 GP clients with known θ*, transforms off as in
the README. Runs of each: ``stop="auto"`` with budgets of 30 and 400 rounds, and a 400-round run
without a rule, whose rounds 100-400 show where the state settles (or the noise floor that Adam
with minibatches jitters in); and the default with ``stop="auto"`` on the data standardised, as
``fit`` does by default. Writes results/benchmarks/stopping_auto.csv: one row per run with
the rounds run, the stop reason, whether a ConvergenceWarning (or its DivergenceWarning) was
raised, the final state, and for the long runs the range of the outputscale over rounds 100-400.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gpytorch
import pandas as pd

import fedgp
from fedgp.errors import ConvergenceWarning

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "stopping_auto.csv"
THETA = {
    "covar_module.outputscale": 2.0,
    "likelihood.noise_covar.noise": 0.1,
    "covar_module.base_kernel.lengthscale": [[0.3, 0.5]],
}


STRATEGIES = {
    "default": fedgp.strategies.FGPR(),
    "authors": fedgp.strategies.FGPR.authors(local_steps=5, batch_size=32, lr=0.05),
}


def run(label: str, rounds: int, stop, transforms=None) -> dict:
    draws = fedgp.synthetic.gp_federation(num_clients=20, n=250, d=2, theta=THETA, n_test=50, seed=0)
    spec = fedgp.GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))
    strategy = STRATEGIES[label]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fedgp.fit(
            spec,
            draws.federation,
            strategy,
            rounds=rounds,
            seed=0,
            stop=stop,
            transforms=transforms,
            callbacks=[fedgp.run.Evaluate(every=0)],
        )
    state = result.state
    row = {
        "strategy": label,
        "stop": repr(stop),
        "transforms": repr(transforms),
        "budget": rounds,
        "rounds_run": len(result.history),
        "stop_reason": result.history.attrs.get("stop_reason", ""),
        "convergence_warning": any(issubclass(w.category, ConvergenceWarning) for w in caught),
        "diverging": bool(result.history.attrs.get("diverging", False)),
        "outputscale": float(state["covar_module.outputscale"]),
        "noise": float(state["likelihood.noise_covar.noise"]),
        "lengthscale0": float(state["covar_module.base_kernel.lengthscale"].flatten()[0]),
        "lengthscale1": float(state["covar_module.base_kernel.lengthscale"].flatten()[1]),
    }
    if stop is None and rounds >= 100:
        tail = result.history["covar_module.outputscale"].iloc[99:]
        row.update(
            outputscale_min_100_on=float(tail.min()),
            outputscale_max_100_on=float(tail.max()),
            outputscale_mean_100_on=float(tail.mean()),
        )
    return row


def main() -> None:
    rows = [
        run(label, rounds, stop)
        for label in STRATEGIES
        for rounds, stop in ((30, "auto"), (400, "auto"), (400, None))
    ]
    rows.append(run("default", 400, "auto", transforms="auto"))  # the data standardised, as fit does
    frame = pd.DataFrame(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(OUT, index=False)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
