"""The three runs whose numbers are pinned across refactors: the README example, Table 2's repeat 0
for FGPR, and mixed-regression setting C.1 seed 0 (two-phase). Each returns ``{name: [floats]}``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def _flat(state) -> dict[str, list[float]]:
    return {k: torch.as_tensor(v).detach().reshape(-1).tolist() for k, v in state.items()}


def readme_example() -> dict[str, list[float]]:
    """The README's ten lines, run as written: the final state and the last round's test metrics."""
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    code = "\n".join(line for line in block.splitlines() if not line.startswith("print("))
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    result = namespace["result"]
    last = result.history.iloc[-1]
    out = _flat(result.state)
    out["history.test_rmse_mean"] = [float(last["test_rmse_mean"])]
    out["history.train_nll"] = [float(last["train_nll"])]
    X = torch.linspace(0, 1, 10, dtype=torch.float64).reshape(5, 2)  # the README draws its X at random
    mean, var = result.predict(X, client=3)
    out["predict.mean"], out["predict.var"] = mean.tolist(), var.tolist()
    out["evaluate.rmse"] = result.evaluate()["rmse"].tolist()
    return out


def table2_fgpr_repeat0(root=None) -> dict[str, list[float]]:
    """Table 2, repeat 0, FGPR only: the learned state per sensor and the 40 test engines' RMSEs."""
    from fedgp.experiments.table2 import Table2Settings, fgpr_repeat

    out: dict[str, list[float]] = {}
    for sensor, (state, rmse) in fgpr_repeat(Table2Settings(), seed=0, repeat=0, root=root).items():
        out.update({f"{sensor}.{k}": v for k, v in _flat(state).items()})
        out[f"{sensor}.rmse"] = [float(x) for x in rmse]
    return out


def mixed_regression_c1() -> dict[str, list[float]]:
    """Su–Xu–Yang setting C.1, seed 0, two-phase (Phase 1 + 400 Phase-2 rounds): final cluster
    regressors and the final error curve value."""
    from fedgp.experiments.mixed_regression import run_setting

    finals, curves = run_setting("C1", seed=0, methods=("two_phase",), sweep=False)
    row = finals.set_index("method").loc["two_phase"]
    curve = curves[curves["method"] == "two_phase"]
    return {
        "final_error": [float(row["final_error"])],
        "curve_error": [float(x) for x in np.asarray(curve["error"])],
    }


CASES = {
    "readme_example": readme_example,
    "table2_fgpr_repeat0": table2_fgpr_repeat0,
    "mixed_regression_c1_seed0": mixed_regression_c1,
}


def zoo() -> dict:
    """``{name: (data, spec, strategy, rounds)}``: a small run of every strategy family."""
    import gpytorch

    from fedgp import GPSpec
    from fedgp.data import gaussian_mixed_regression, gp_federation
    from fedgp.models import ZeroKernel
    from fedgp.strategies import FGPR, IFCA, LocalTraining, MomentDescentInit
    from fedgp.strategies import clustered as C

    noise = "likelihood.noise_covar.noise"
    gp = gp_federation(num_clients=6, n=[20, 25, 30, 18, 22, 27], d=2, n_test=10, seed=3)
    mr = gaussian_mixed_regression(k=2, d=4, sizes=[6, 9, 12, 30, 30, 8, 5, 25, 30, 7], noise=0.2, seed=5)
    lin = GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(4, bias=False),
        initial_values={noise: 0.04, "mean_module.weights": torch.zeros(4, 1)},  # LinearMean draws its own
        fixed=[noise],
    )
    train = LocalTraining(steps=3, batch_size=8)
    runs = {
        "fgpr_partial_sgd": (
            gp,
            FGPR(local_steps=3, batch_size=8, optimizer="sgd", lr=0.01, clients_per_round=4),
            4,
        ),
        "fgpr_raw_nearest_epochs": (
            gp,
            FGPR(local_epochs=1, batch_size=10, minibatch="nearest", average_space="raw", prox_mu=0.1),
            3,
        ),
        "fgpr_uniform_sampling": (gp, FGPR(clients_per_round=3, sampling="uniform", batch_size=8), 3),
        "ifca_model_restarts": (gp, IFCA(num_clusters=2, restarts=2, batch_size=8, local_steps=2), 3),
        "ifca_gradient": (
            gp,
            IFCA(num_clusters=2, aggregation="gradient", lr=0.1, gradient_batch_size=12),
            3,
        ),
        "clustered_soft": (
            gp,
            C.ClusteredGP(
                2, C.RandomInit(), C.SoftAssigner(2.0), C.LocalTrainingSolver(train), C.ClusterAverage()
            ),
            3,
        ),
        "clustered_oneshot_train": (
            gp,
            C.ClusteredGP(
                2,
                C.OneShotInit(local="train", training=train),
                C.FixedAssigner(),
                C.LocalTrainingSolver(train),
                C.ClusterAverage(),
            ),
            3,
        ),
        "linear_one_shot": (mr, C.one_shot(2, lr=0.1), 4),
        "linear_ifca_gradient_cluster": (
            mr,
            C.ClusteredGP(
                2,
                C.RandomInit(),
                C.HardAssigner("sse"),
                C.GradientSolver(),
                C.GradientStep(0.1, "cluster", "squared_loss"),
            ),
            4,
        ),
        "linear_fedprox_soft": (
            mr,
            C.ClusteredGP(
                2,
                C.RandomInit(scale=0.5),
                C.SoftAssigner(),
                C.ProximalSolve(0.1, "squared_loss"),
                C.GlobalWeighted(),
            ),
            4,
        ),
        "linear_two_phase_orth_power": (
            mr,
            C.two_phase(
                2,
                lr=0.1,
                phase1=MomentDescentInit(
                    num_anchors=4,
                    iterations=2,
                    subspace="orth_iter",
                    orth_iters=4,
                    power_iters=5,
                    anchor_pool="all",
                ),
            ),
            None,
        ),
        "linear_two_phase_refill": (
            mr,
            C.two_phase(
                2,
                lr=0.1,
                phase1=MomentDescentInit(num_anchors=3, iterations=2, delta=100.0, anchor_pool="all"),
            ),
            None,
        ),
    }
    return {
        name: (
            data,
            data.spec if hasattr(data, "spec") else lin,
            strategy,
            rounds or strategy.init_rounds + 3,
        )
        for name, (data, strategy, rounds) in runs.items()
    }


def strategy_zoo() -> dict[str, list[float]]:
    """Small runs of every strategy family on both engines: final global states, the history's
    train NLL and per-client evaluation. A net under the refactor, beyond the issue's three pins."""
    import fedgp

    out: dict[str, list[float]] = {}
    for name, (data, spec, strategy, rounds) in zoo().items():
        for engine in ("sequential", "batched"):
            result = fedgp.fit(
                spec,
                data.federation,
                strategy,
                rounds=rounds,
                engine=engine,
                seed=11,
                progress=False,
                outcome_transform=None,
                input_transform=None,
            )
            key = f"{name}.{engine}"
            for k, v in _flat(result.state).items():
                out[f"{key}.{k}"] = v
            if "train_nll" in result.history:
                out[f"{key}.train_nll"] = [float(x) for x in result.history["train_nll"].dropna()]
            if data.federation.has_test:
                out[f"{key}.evaluate.rmse"] = result.evaluate()["rmse"].tolist()
    return out


CASES["strategy_zoo"] = strategy_zoo
