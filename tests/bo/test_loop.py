"""The BO harness: owners' checks (errors name the owner), the loop's history and callbacks."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgp.bo import BOLoop, Budget, Owner, RandomSearch
from fedgp.errors import InputError, InputTypeError

BOX = [[0.0, 0.0], [1.0, 1.0]]


def quadratic(X):
    return -(X - 0.3).pow(2).sum(-1)


def test_objective_of_the_wrong_shape_is_refused_naming_the_owner():
    owners = [Owner("good", quadratic, BOX), Owner("lab-7", lambda X: torch.zeros(len(X), 2), BOX)]
    with pytest.raises(InputError, match=r"owner 'lab-7'.*shape \(3, 2\)"):
        BOLoop(owners, RandomSearch(), 2).run()


def test_nan_from_an_objective_mid_run_is_refused_naming_the_owner():
    calls = []

    def flaky(X):
        calls.append(len(X))
        return quadratic(X) * (math.nan if len(calls) == 3 else 1.0)

    owners = [Owner("a", quadratic, BOX), Owner("line-2", flaky, BOX)]
    loop = BOLoop(owners, RandomSearch(), 5).start()
    loop.step()
    with pytest.raises(InputError, match=r"owner 'line-2'.*non-finite value \(nan\)"):
        loop.step()


def test_objective_returning_text_is_refused_naming_the_owner():
    with pytest.raises(InputTypeError, match="owner 3"):
        BOLoop([Owner(3, lambda X: ["a"] * len(X), BOX)], RandomSearch(), 1).run()


def test_bad_owners_and_settings_are_refused():
    with pytest.raises(InputError, match="lower < upper"):
        Owner("x", quadratic, [[0.0, 1.0], [1.0, 1.0]])
    with pytest.raises(InputError, match="same number of inputs"):
        BOLoop([Owner("a", quadratic, BOX), Owner("b", quadratic, [[0.0], [1.0]])], RandomSearch(), 1)
    with pytest.raises(InputError, match="distinct"):
        BOLoop([Owner("a", quadratic, BOX), Owner("a", quadratic, BOX)], RandomSearch(), 1)
    with pytest.raises(InputTypeError, match="Method"):
        BOLoop([Owner("a", quadratic, BOX)], "random", 1)


def test_history_regret_and_budget():
    owners = [Owner(k, quadratic, BOX, optimum=0.0) for k in range(3)]
    seen = []
    result = BOLoop(
        owners, RandomSearch(), 10, initial=2, callbacks=[Budget(evaluations=5), seen.append]
    ).run()
    h = result.history
    assert result.stop_reason == "every owner made 5 evaluations"
    assert list(h["iteration"].unique()) == [0, 1, 2, 3] and len(seen) == 3
    assert (h["evaluations"] == h["iteration"] + 2).all()
    for k, o in enumerate(owners):
        rows = h[h["owner"] == k]
        assert float(rows["best_observed"].iloc[-1]) == float(o.y.max())
        np.testing.assert_allclose(rows["regret"], -rows["best_observed"])


@settings(max_examples=25)
@given(
    d=st.integers(1, 4),
    owners=st.integers(1, 4),
    initial=st.integers(1, 4),
    iterations=st.integers(1, 5),
    seed=st.integers(0, 2**31),
    low=st.floats(-100, 100),
    width=st.floats(1e-3, 1e3),
)
def test_loop_keeps_every_point_in_its_box_and_best_values_monotone(
    d, owners, initial, iterations, seed, low, width
):
    bounds = [[low] * d, [low + width] * d]
    team = [Owner(k, lambda X: X.sum(-1), bounds) for k in range(owners)]
    h = BOLoop(team, RandomSearch(), iterations, initial=initial, seed=seed).run().history
    for owner in team:
        assert len(owner.y) == initial + iterations
        assert ((owner.X >= owner.bounds[0]) & (owner.X <= owner.bounds[1])).all()
        best = h[h["owner"] == owner.id]["best_observed"].to_numpy()
        assert (np.diff(best) >= 0).all() and best[-1] == float(owner.y.max())


def test_progress_reports_the_iterations_on_a_log(capfd, monkeypatch):
    import fedgp.run.progress
    from fedgp.bo import BOProgress

    monkeypatch.setattr(fedgp.run.progress, "MIN_SECONDS", 0.0)  # a line even for a quick loop
    BOLoop([Owner("a", quadratic, BOX)], RandomSearch(), 4, callbacks=[BOProgress(True)]).run()
    err = capfd.readouterr().err
    assert "random" in err and "4/4" in err


def test_budget_in_seconds_stops_the_loop():
    result = BOLoop([Owner("a", quadratic, BOX)], RandomSearch(), 50, callbacks=[Budget(seconds=1e-9)]).run()
    assert result.stop_reason.endswith("of wall time spent") and result.history["iteration"].max() == 1


def test_bo_methods_without_botorch_name_the_extra(tmp_path):
    """Before any round is trained: a missing BoTorch is said at construction."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['botorch'] = None\n"
        "import fedgp\nfrom fedgp.bo import FederatedBO, LocalBO\n"
        "from fedgp.errors import MissingExtraError\n"
        "for make in (lambda: FederatedBO(fedgp.GPSpec()), LocalBO):\n"
        "    try:\n        make()\n    except MissingExtraError as err:\n        print('missing', err.name)\n"
    )
    from pathlib import Path

    env = {
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.stdout.split("\n")[:2] == ["missing botorch", "missing botorch"], done.stderr[-2000:]
