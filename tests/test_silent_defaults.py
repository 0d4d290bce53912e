"""No silent fallback anywhere (issue 49): every path of ``tests/silent_paths.py`` — an unknown owner, an
empty evaluation, a prior-only prediction, a dropped or reordered column, a missing test split, what a
saved file forgets, in each door — raises, warns or gives the right answer; a default the user chose
explicitly comes quietly. A path added to that list which returns a default without a word fails here
until it is closed. (``benchmarks/silent_defaults.py`` tabulates the same paths, and 0656142's outcomes.)"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.silent_paths import PATHS, Env, observe

if os.environ.get("CI", "").strip().lower() != "true":
    pytest.importorskip("flwr")
    pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return Env(tmp_path_factory.mktemp("silent"))


@pytest.mark.parametrize("path", PATHS, ids=[f"{p.door}: {p.path}" for p in PATHS])
def test_no_path_returns_a_default_without_a_word(env, path):
    outcome, said = observe(path, env)
    if path.chosen:
        assert outcome == "chosen, quiet", f"{path.trigger}: chosen explicitly, yet {outcome}: {said}"
    else:
        assert outcome in ("raises", "warns", "answers"), f"{path.trigger}: {outcome}"


def test_the_defaults_say_what_to_do(env):
    """The new warnings name the case and the way out, not only that something happened."""
    said = {(p.door, p.path): observe(p, env)[1] for p in PATHS}
    assert (
        "not seen in fit" in said["sklearn", "unknown owner"]
        and "unknown_groups='prior'" in said["sklearn", "unknown owner"]
    )
    assert "fed.split(0.25" in said["python", "empty evaluation"]
    assert "--test-fraction" in said["python", "empty evaluation"]
    assert "test-fraction" in said["flower", "no test split"]
    assert "not features of the model" in said["cli", "extra column"]
    assert "which recorded no feature names" in said["saved file", "a file of format version 3"]


def test_an_evaluation_that_leaves_clients_out_says_which(env, monkeypatch):
    """A client that cannot score its test rows is left out of ``evaluate``: named in a warning, not
    only in ``attrs["failures"]`` of a table that looks complete."""
    import dataclasses

    import pandas as pd
    import torch

    import fedgp
    from fedgp.run import result as result_module

    def one_failed(*args, **kwargs):
        frame = pd.DataFrame({"client": ["p"], "n_test": [3], "rmse": [0.1]})
        frame.attrs["failures"] = {"q": "could not factorise its kernel matrix"}
        return frame

    monkeypatch.setattr(result_module, "evaluate_clients", one_failed)
    roster = dataclasses.replace(env.result.roster, n_test=torch.tensor([3, 3, 0]))
    with pytest.warns(
        fedgp.FallbackWarning, match="left out the clients that could not evaluate: {'q': 'could not"
    ):
        dataclasses.replace(env.result, roster=roster).evaluate()


@pytest.fixture(scope="module")
def estimator(env):
    return env.estimator(False)


@given(st.lists(st.sampled_from(["p", "q", "r", "P", "s", "p "]), min_size=1, max_size=8))
def test_predict_names_exactly_the_owners_fit_never_saw(env, estimator, groups):
    """Any labels: the known ones get their own posterior, the unknown ones the prior and one warning
    naming each of them (and no other)."""
    import warnings

    import numpy as np

    import fedgp
    from fedgp.data import ClientData

    X = env.X.to_numpy()[: len(groups)]
    unknown = sorted({g for g in groups if g not in "pqr"}, key=groups.index)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean = estimator.predict(X, groups=groups)
    said = [str(w.message) for w in caught if issubclass(w.category, fedgp.FallbackWarning)]
    assert len(said) == (1 if unknown else 0)
    for owner in {"p", "q", "r", "P", "s", "p "}:
        assert (f"{owner!r} (" in "".join(said)) == (owner in unknown)
    for i, owner in enumerate(groups):
        client = owner if owner in "pqr" else ClientData(np.empty((0, 3)), np.empty(0))
        want = estimator.result_.predict(X[i : i + 1], client=client)[0]
        np.testing.assert_allclose(mean[i], want.numpy(), rtol=1e-12)
