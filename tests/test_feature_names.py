"""Feature names travel with the model (issue 49): a federation built from named columns records them,
and every door — ``FitResult`` and a loaded one, the exports, scikit-learn, the CLI's model folder and
the Flower app's output — matches columns given in another order by name, and refuses missing or extra
ones, naming them. On 0656142 a reordered ``DataFrame`` was read by position: another answer, no word.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.errors import InputError

NAMES = ["a", "b", "c"]


def named_frame(n=90, seed=0) -> tuple[pd.DataFrame, np.ndarray, list[np.ndarray]]:
    """Three features on very different scales (so a swap changes every prediction), three owners."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"a": rng.uniform(0, 1, n), "b": rng.uniform(0, 10, n), "c": rng.uniform(-50, 50, n)})
    y = np.sin(6 * X["a"]) + 0.1 * X["b"] + 0.01 * X["c"] + 0.05 * rng.normal(size=n)
    return X, y.to_numpy(), np.array_split(np.arange(n), 3)


@pytest.fixture(scope="module")
def fitted():
    X, y, parts = named_frame()
    fed = Federation.from_partition(X, y, parts, ids=["p", "q", "r"])
    result = fedgp.fit(fedgp.GPSpec(), fed, rounds=4, seed=0, callbacks=[fedgp.run.Progress(False)])
    return X, y, fed, result


def test_the_issues_reproduction_reorders_by_name(fitted):
    X, _, fed, result = fitted
    assert fed.feature_names == ("a", "b", "c") and result.feature_names == ("a", "b", "c")
    want_mean, want_var = result.predict(X.iloc[:5], client="p")
    for order in (["b", "a", "c"], ["c", "b", "a"]):
        mean, var = result.predict(X[order].iloc[:5], client="p")
        torch.testing.assert_close(mean, want_mean, rtol=0, atol=0)
        torch.testing.assert_close(var, want_var, rtol=0, atol=0)
    # the combined prediction and an unnamed array in the recorded order agree too
    combined = result.predict(X.iloc[:5], combine="gpoe")[0]
    torch.testing.assert_close(result.predict(X[["c", "a", "b"]].iloc[:5], combine="gpoe")[0], combined)
    torch.testing.assert_close(result.predict(X.iloc[:5].to_numpy(), client="p")[0], want_mean)


@pytest.mark.parametrize(
    "columns, named",
    [
        (["a", "b"], "missing 'c'"),
        (["a", "b", "c", "d"], "not features of the model 'd'"),
        (["a", "b", "z"], "missing 'c'; not features of the model 'z'"),
    ],
)
def test_missing_or_extra_columns_are_refused_naming_them(fitted, columns, named):
    X, _, _, result = fitted
    frame = X.assign(d=1.0, z=2.0)[columns].iloc[:3]
    with pytest.raises(
        InputError, match=f"predict for client 'p': X's columns are not the model's features \\({named}\\)"
    ):
        result.predict(frame, client="p")
    new = ClientData(X.assign(d=1.0, z=2.0)[columns].iloc[:20], np.arange(20.0), id="new")
    with pytest.raises(InputError, match=f"client 'new'.*{named}"):
        result.predict(X.iloc[:3], client=new)


def test_a_new_client_with_its_columns_in_another_order_is_reordered(fitted):
    X, y, _, result = fitted
    rows = slice(0, 25)
    own = ClientData(X.iloc[rows], y[rows], id="new")
    swapped = ClientData(X[["c", "a", "b"]].iloc[rows], y[rows], id="new")
    assert swapped.feature_names == ("c", "a", "b")
    want = result.predict(X.iloc[40:45], client=own)[0]
    torch.testing.assert_close(result.predict(X.iloc[40:45], client=swapped)[0], want)
    # through the exports as well: their training inputs are in the model's order, and they say so
    gp = result.to_gpytorch(swapped)
    assert gp.feature_names == ("a", "b", "c")
    torch.testing.assert_close(gp.train_inputs[0], own.X)
    with torch.no_grad():
        torch.testing.assert_close(
            gp(torch.tensor(X.iloc[40:45].to_numpy())).mean, want, rtol=1e-8, atol=1e-10
        )


def test_botorch_export_names_its_inputs(fitted):
    pytest.importorskip("botorch")
    X, y, _, result = fitted
    swapped = ClientData(X[["b", "c", "a"]].iloc[:25], y[:25], id="new")
    model = result.to_botorch(swapped)
    assert model.feature_names == ("a", "b", "c")
    own = ClientData(X.iloc[:25], y[:25], id="new")
    with torch.no_grad():
        mean = model.posterior(torch.tensor(X.iloc[40:45].to_numpy())).mean.squeeze(-1)
    torch.testing.assert_close(mean, result.predict(X.iloc[40:45], client=own)[0], rtol=1e-8, atol=1e-10)


def test_a_loaded_result_keeps_the_names_and_reorders(fitted, tmp_path):
    X, y, fed, result = fitted
    loaded = fedgp.load(result.save(tmp_path / "m.fedgp"))
    assert loaded.feature_names == ("a", "b", "c")
    client = ClientData(X[["c", "b", "a"]].iloc[:30], y[:30], id="p")
    want = result.predict(X.iloc[40:44], client="p")[0]
    torch.testing.assert_close(loaded.predict(X[["b", "c", "a"]].iloc[40:44], client=client)[0], want)
    with pytest.raises(InputError, match="missing 'b'"):
        loaded.predict(X[["a", "c"]].iloc[:2], client=fed[0])


def test_a_federation_names_its_columns_once_and_keeps_them(fitted):
    X, y, fed, _ = fitted
    assert fed[1:].feature_names == ("a", "b", "c") and fed.split(0.3, seed=0).feature_names == (
        "a",
        "b",
        "c",
    )
    assert all(c.feature_names == ("a", "b", "c") for c in fed.split(0.3, seed=0))
    # explicit names for unnamed arrays; a DataFrame is put in their order by name
    explicit = Federation.from_partition(
        X.to_numpy(), y, [np.arange(10), np.arange(10, 20)], feature_names=NAMES
    )
    assert explicit.feature_names == ("a", "b", "c")
    reordered = Federation.from_partition(X[["c", "a", "b"]], y, [np.arange(10)], feature_names=NAMES)
    torch.testing.assert_close(reordered[0].X, explicit[0].X)
    # clients that disagree are refused, naming the client and both orders; an unnamed one follows
    with pytest.raises(InputError, match=r"client 2 names its columns \['b', 'a', 'c'\], but client 1 names"):
        Federation(
            [ClientData(X.iloc[:9], y[:9], id=1), ClientData(X[["b", "a", "c"]].iloc[:9], y[:9], id=2)]
        )
    mixed = Federation([ClientData(X.iloc[:9], y[:9], id=1), ClientData(X.iloc[:9].to_numpy(), y[:9], id=2)])
    assert mixed.feature_names == ("a", "b", "c") and mixed[1].feature_names == ("a", "b", "c")
    # a DataFrame X_test is put in X's order by name
    client = ClientData(X.iloc[:9], y[:9], X_test=X[["c", "b", "a"]].iloc[9:12], y_test=y[9:12], id=0)
    torch.testing.assert_close(client.X_test, torch.as_tensor(X.iloc[9:12].to_numpy()))
    with pytest.raises(InputError, match=r"client 0, X_test: .*missing 'c'"):
        ClientData(X.iloc[:9], y[:9], X_test=X[["a", "b"]].iloc[9:12], y_test=y[9:12], id=0)


@pytest.mark.parametrize(
    "columns, message",
    [
        (["a", 1, "c"], "mix strings and other values"),
        (["a", "a", "c"], "'a' appear more than once"),
    ],
)
def test_columns_that_cannot_be_matched_by_name_are_refused(columns, message):
    frame = pd.DataFrame(np.random.default_rng(0).normal(size=(5, 3)), columns=columns)
    with pytest.raises(InputError, match=message):
        ClientData(frame, np.arange(5.0), id="x")


def test_without_recorded_names_a_dataframe_is_read_by_position():
    X, y, parts = named_frame(n=45)
    fed = Federation.from_partition(X.to_numpy(), y, parts)
    assert fed.feature_names is None
    result = fedgp.fit(fedgp.GPSpec(), fed, rounds=2, callbacks=[fedgp.run.Progress(False)])
    assert result.feature_names is None
    by_position = result.predict(X[["b", "a", "c"]].iloc[:3], client=0)[0]
    torch.testing.assert_close(
        by_position, result.predict(X[["b", "a", "c"]].iloc[:3].to_numpy(), client=0)[0]
    )


# -- property-based: any order of any names gives the same prediction; any other set is refused ------------
@st.composite
def columns_given(draw):
    """A permutation of the model's columns, or a set that differs from them (missing and/or extra)."""
    kept = draw(st.permutations(NAMES))
    if draw(st.booleans()):
        return list(kept), True
    drop = draw(st.integers(0, 2))
    extra = draw(st.lists(st.sampled_from(["d", "e", "A", " a", "b "]), unique=True, max_size=2))
    columns = list(kept[drop:]) + extra
    if sorted(columns) == sorted(NAMES) or not columns:
        columns = list(kept[1:]) + ["zz"]
    return draw(st.permutations(columns)), False


@given(columns_given())
def test_any_order_predicts_the_same_and_any_other_set_is_refused_naming_it(fitted, case):
    X, _, _, result = fitted
    columns, same = case
    frame = X.assign(**{c: 0.5 for c in ["d", "e", "A", " a", "b ", "zz"]})[columns].iloc[:4]
    if same:
        torch.testing.assert_close(
            result.predict(frame, client="q")[0], result.predict(X.iloc[:4], client="q")[0]
        )
        return
    with pytest.raises(InputError) as err:
        result.predict(frame, client="q")
    said = str(err.value).split(". The model")[0]  # what is wrong, before the list of the model's own
    missing, extra = said.partition("not features of the model")[::2]
    assert all(repr(name) in missing for name in set(NAMES) - set(columns))
    assert all(repr(name) in extra for name in set(columns) - set(NAMES))


@given(st.permutations(NAMES), st.lists(st.sampled_from(NAMES), min_size=0, max_size=3))
def test_a_client_put_in_any_order_is_the_same_client(order, _):
    X, y, _ = named_frame(n=12)
    client = ClientData(X[list(order)], y, id="k")
    assert client.feature_names == tuple(order)
    back = client.in_order(tuple(NAMES))
    assert back.feature_names == tuple(NAMES)
    torch.testing.assert_close(back.X, torch.tensor(X.to_numpy()))


# -- scikit-learn ---------------------------------------------------------------------------------------
def test_sklearn_reorders_a_dataframe_by_name_and_refuses_other_columns():
    pytest.importorskip("sklearn")
    from fedgp.sklearn import FederatedGPRegressor

    X, y, parts = named_frame()
    groups = np.concatenate([[owner] * len(rows) for owner, rows in zip("pqr", parts)])
    est = FederatedGPRegressor(rounds=3).fit(X, y, groups=groups)
    assert est.feature_names_in_.tolist() == NAMES and est.result_.feature_names == tuple(NAMES)
    want = est.predict(X.iloc[:6], groups=groups[:6])
    np.testing.assert_array_equal(est.predict(X[["c", "a", "b"]].iloc[:6], groups=groups[:6]), want)
    with pytest.raises(ValueError, match="missing 'b'; not features of the model 'd'"):
        est.predict(X.assign(d=1.0)[["a", "c", "d"]].iloc[:6], groups=groups[:6])


# -- the CLI --------------------------------------------------------------------------------------------
def test_the_cli_model_records_its_features_and_predict_reads_a_reordered_table(tmp_path, capsys):
    from fedgp.cli import main

    X, y, parts = named_frame()
    table = X.assign(owner=np.concatenate([[o] * len(r) for o, r in zip("pqr", parts)]), y=y)
    table.to_csv(tmp_path / "data.csv", index=False)
    argv = ["fit", str(tmp_path / "data.csv"), "--target", "y", "--group", "owner", "--rounds", "3"]
    assert main([*argv, "--stop", "none", "--quiet", "--out", str(tmp_path / "m")]) == 0
    model = fedgp.load(tmp_path / "m" / "model.fedgp")
    assert model.feature_names == tuple(json.loads((tmp_path / "m" / "columns.json").read_text())["features"])
    assert model.feature_names == ("a", "b", "c")
    new = table.iloc[::7].drop(columns="y")
    predictions = []
    for name, frame in {"new": new, "swapped": new[["c", "owner", "b", "a"]].assign(note=1)}.items():
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
        run = [
            "predict",
            str(tmp_path / "m"),
            str(tmp_path / f"{name}.csv"),
            "--data",
            str(tmp_path / "data.csv"),
        ]
        assert main([*run, "--quiet", "--out", str(tmp_path / name)]) == 0
        predictions.append(pd.read_csv(tmp_path / name / "predictions.csv"))
    np.testing.assert_array_equal(predictions[1]["mean"], predictions[0]["mean"])
    # a column the model does not read is named, not silently ignored
    assert "column(s) 'note' are not features of the model" in capsys.readouterr().err


def test_a_model_folder_whose_files_disagree_is_refused(tmp_path, capsys):
    from fedgp.cli import main

    X, y, parts = named_frame(n=45)
    table = X.assign(owner=np.concatenate([[o] * len(r) for o, r in zip("pqr", parts)]), y=y)
    table.to_csv(tmp_path / "data.csv", index=False)
    argv = ["fit", str(tmp_path / "data.csv"), "--target", "y", "--group", "owner", "--rounds", "2"]
    assert main([*argv, "--stop", "none", "--quiet", "--out", str(tmp_path / "m")]) == 0
    columns = json.loads((tmp_path / "m" / "columns.json").read_text())
    columns["features"] = ["b", "a", "c"]
    (tmp_path / "m" / "columns.json").write_text(json.dumps(columns))
    table.drop(columns="y").to_csv(tmp_path / "new.csv", index=False)
    run = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(tmp_path / "data.csv")]
    assert main([*run, "--quiet", "--out", str(tmp_path / "p")]) == 2
    assert (
        "trained on features ['a', 'b', 'c'] but columns.json lists ['b', 'a', 'c']"
        in capsys.readouterr().err
    )


# -- the Flower app -------------------------------------------------------------------------------------
def test_the_flower_apps_model_names_the_nodes_columns(tmp_path):
    if os.environ.get("CI", "").strip().lower() != "true":
        pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from fedgp.flower import app as flower_app
    from tests.flower.test_flower_app import deploy, owner_tables

    paths = owner_tables(tmp_path)
    config = {"rounds": 3, "stop": "none", "out-dir": str(tmp_path / "out"), "eval-every": 0}
    flower_app._main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    model = fedgp.load(tmp_path / "out" / "model.fedgp")
    assert model.feature_names == ("x1", "x2", "x3")
    assert json.loads((tmp_path / "out" / "columns.json").read_text())["features"] == ["x1", "x2", "x3"]
    rows = pd.read_csv(paths[0])
    client = ClientData(
        rows[rows.owner == "plant_A"][["x3", "x1", "x2"]], rows[rows.owner == "plant_A"]["y"], id="A"
    )
    X = rows[["x1", "x2", "x3"]].iloc[:4]
    want = model.predict(X.to_numpy(), client=client)[0]
    torch.testing.assert_close(model.predict(X[["x2", "x3", "x1"]], client=client)[0], want)


# -- property-based: which labels name columns, and explicit names ----------------------------------------
LABELS = st.lists(st.one_of(st.text(max_size=4), st.integers(-3, 3)), min_size=1, max_size=5)


@given(LABELS)
def test_a_frame_names_its_columns_only_when_every_label_is_a_distinct_string(labels):
    from fedgp.data.names import frame_names

    frame = pd.DataFrame(np.zeros((2, len(labels))), columns=labels)
    strings = [isinstance(label, str) for label in labels]
    if not any(strings):
        assert frame_names(frame, "here") is None  # integer labels name nothing: read by position
    elif not all(strings):
        with pytest.raises(InputError, match="here: X's column labels mix strings and other values"):
            frame_names(frame, "here")
    elif len(set(labels)) < len(labels):
        with pytest.raises(InputError, match="appear more than once"):
            frame_names(frame, "here")
    else:
        assert frame_names(frame, "here") == tuple(labels)


@given(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4, unique=True), st.data())
def test_explicit_names_put_a_frames_columns_in_their_order(names, data):
    order = data.draw(st.permutations(names))
    rng = np.random.default_rng(len(names))
    X = pd.DataFrame(rng.normal(size=(6, len(names))), columns=names)
    y = rng.normal(size=6)
    fed = Federation.from_partition(X[list(order)], y, [np.arange(3), np.arange(3, 6)], feature_names=names)
    assert fed.feature_names == tuple(names) and all(c.feature_names == tuple(names) for c in fed)
    torch.testing.assert_close(torch.cat([c.X for c in fed]), torch.tensor(X.to_numpy()))
    unnamed = Federation.from_partition(X.to_numpy(), y, [np.arange(6)], feature_names=order)
    assert unnamed.feature_names == tuple(order)  # an unnamed array: the names are its columns, as given
    torch.testing.assert_close(unnamed[0].X, torch.tensor(X.to_numpy()))
