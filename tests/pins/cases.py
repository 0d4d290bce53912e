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
    """The runs of :func:`fedgp.testing.zoo.strategy_zoo`."""
    from fedgp.testing.zoo import strategy_zoo as runs

    return runs()


def strategy_zoo() -> dict[str, list[float]]:
    """Small runs of every strategy family on both engines: final global states, the history's
    train NLL and per-client evaluation. A net under the refactor, beyond the issue's three pins."""
    import fedgp

    out: dict[str, list[float]] = {}
    for name, (data, spec, strategy, rounds) in zoo().items():
        for engine in ("sequential", "batched"):
            result = fedgp.fit(
                spec, data.federation, strategy, engine=engine, rounds=rounds, seed=11, transforms=None
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
