"""A saved result is the result (issue 49): everything ``FitResult`` holds that a user reads — the
history (values, dtypes, index) and all its ``attrs`` (why it stopped, the privacy accounting, ...),
the failures, the transforms, the feature names, the roster, the attackers, the seed and the state —
comes back from ``save``/``load`` field by field, and from the CLI's model folder and the Flower app's
output. On 0656142 ``history.attrs`` came back holding only ``transforms``."""

from __future__ import annotations

import dataclasses
import math
import os
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.errors import FallbackWarning, InputTypeError
from fedgp.messages import Roster
from fedgp.messages.container import pack, seal
from fedgp.run.saved import _references
from fedgp.strategies import FGPR, IFCA
from tests.export.test_file_bounds import refused, reseal

QUIET = [fedgp.run.Progress(False)]


@pytest.fixture(scope="module")
def bases():
    """Results of three kinds: FGPR with a stopping rule, IFCA without transforms, FGPR under ClientDP."""
    draws = fedgp.synthetic.gp_federation(num_clients=4, n=16, d=2, seed=0, n_test=4)
    spec, fed = draws.spec, draws.federation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the budget ends before the rule holds: a ConvergenceWarning
        return {
            "fgpr": fedgp.fit(spec, fed, FGPR(local_steps=1), rounds=3, stop="auto", callbacks=QUIET),
            "ifca": fedgp.fit(spec, fed, IFCA(num_clusters=2), rounds=2, transforms=None, callbacks=QUIET),
            "dp": fedgp.fit(
                spec,
                fed,
                fedgp.run.ClientDP(FGPR(), noise=1.0, clip=1.0, rate=1.0, delta=1e-3),
                rounds=2,
                callbacks=QUIET,
            ),  # fmt: skip
        }


def same(a, b, where="") -> None:
    """``a`` and ``b`` equal as JSON values are: the same types (``True`` is not ``1``), NaN equal to NaN."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert [str(d) for d in a.dtypes] == [str(d) for d in b.dtypes]
    pd.testing.assert_frame_equal(a, b, check_exact=True, check_index_type=True, check_column_type=True)


def same_result(loaded: fedgp.FitResult, original: fedgp.FitResult) -> None:
    """``loaded`` holds every field of ``original`` that a saved result keeps, exactly."""
    same_frame(loaded.history, original.history)
    same(dict(loaded.history.attrs), dict(original.history.attrs), "history.attrs")
    same_frame(loaded.failures, original.failures)
    assert loaded.feature_names == original.feature_names
    assert loaded.roster.ids == original.roster.ids
    for name in ("sizes", "n_test", "dims"):
        assert torch.equal(getattr(loaded.roster, name), getattr(original.roster, name))
    assert loaded.attackers == original.attackers and loaded.seed == original.seed
    assert loaded.transforms == original.transforms
    for name, tensor in original.transform.tensors().items():
        assert torch.equal(loaded.transform.tensors()[name], tensor), name
    assert loaded.strategy.to_config() == original.strategy.to_config()
    assert sorted(loaded.state) == sorted(original.state)
    for name, value in original.state.items():
        assert torch.equal(loaded.state[name], value), name


def test_a_real_runs_attrs_come_back(bases, tmp_path):
    """The stop rule's verdict and the privacy accounting, not only the transforms."""
    for name, result in bases.items():
        loaded = fedgp.load(result.save(tmp_path / f"{name}.fedgp"))
        same_result(loaded, result)
    fgpr = fedgp.load(tmp_path / "fgpr.fedgp").history.attrs
    assert fgpr["stop_reason"].startswith("round budget: all 3 rounds ran") and fgpr["stopped"] is False
    assert fgpr["diverging"] is False
    privacy = fedgp.load(tmp_path / "dp.fedgp").history.attrs["privacy"]
    assert (
        privacy == bases["dp"].history.attrs["privacy"]
        and privacy["epsilon"] > 0
        and privacy["delta"] == 1e-3
    )


# -- property-based: results built with varied fields round-trip field by field ------------------------
TEXT = st.text(max_size=6)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(width=64) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
COLUMN = {
    "int64": st.integers(-(2**63), 2**63 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "float64": st.floats(width=64),
    "float32": st.floats(width=32),
    "bool": st.booleans(),
    "str": st.none() | TEXT,
    "object": st.none() | st.booleans() | st.integers(-5, 5) | st.floats(width=64, allow_nan=False) | TEXT,
}


@st.composite
def frames(draw, rows=None, fewest=0):
    n = draw(st.integers(fewest, 4)) if rows is None else rows
    names = draw(st.lists(TEXT, unique=True, min_size=1, max_size=5))  # a history has a column or more
    columns = {}
    for name in names:
        dtype = draw(st.sampled_from(sorted(COLUMN)))
        columns[name] = pd.Series(draw(st.lists(COLUMN[dtype], min_size=n, max_size=n)), dtype=dtype)
    frame = pd.DataFrame(columns, index=pd.RangeIndex(n))
    if draw(st.booleans()):  # an index of its own
        frame.index = draw(st.lists(st.integers(-9, 99) | TEXT, min_size=n, max_size=n, unique=True))
    return frame


@st.composite
def varied_results(draw, bases):
    base = bases[draw(st.sampled_from(sorted(bases)))]
    history = draw(frames(fewest=1))  # a run's history has a row per round, and load refuses none
    history.attrs = {"transforms": base.history.attrs["transforms"]}
    reserved = ("transforms", "states")  # what the file's transforms and kept states hold
    history.attrs.update(draw(st.dictionaries(TEXT.filter(lambda k: k not in reserved), JSON, max_size=4)))
    k = len(base.roster.ids)  # the server state holds one assignment per client: load checks the count
    ids = draw(st.lists(st.integers(-5, 10**6) | TEXT, min_size=k, max_size=k, unique=True))
    sizes = torch.tensor(draw(st.lists(st.integers(2, 10**6), min_size=k, max_size=k)))
    n_test = torch.tensor(draw(st.lists(st.integers(0, 99), min_size=k, max_size=k)))
    roster = Roster(ids, sizes, n_test, torch.full((k,), 2))
    failures = pd.DataFrame(
        draw(st.lists(st.tuples(st.integers(0, 9), st.sampled_from(ids), TEXT), max_size=4)),
        columns=["round", "client", "reason"],
    )
    names = draw(st.none() | st.lists(st.text(min_size=1, max_size=8), min_size=2, max_size=2, unique=True))
    return dataclasses.replace(
        base,
        history=history,
        failures=failures,
        roster=roster,
        attackers=draw(st.lists(st.sampled_from(ids), unique=True, max_size=2)),
        seed=draw(st.integers(-(2**63), 2**64 - 1)),
        feature_names=None if names is None else tuple(names),
    )


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_result_comes_back_field_by_field(bases, tmp_path, data):
    result = data.draw(varied_results(bases))
    same_result(fedgp.load(result.save(tmp_path / "r.fedgp")), result)


# -- what save refuses rather than change, and what load refuses ------------------------------------------
@pytest.mark.parametrize(
    "value, named",
    [
        ((1, 2), r"history.attrs\['x'\]: a tuple.*store a list"),
        ({"a": {1: 2}}, r"history.attrs\['x'\]\['a'\]: key 1 is not a string"),
        (np.arange(3), r"history.attrs\['x'\]: a ndarray"),
        ([object()], r"history.attrs\['x'\]\[0\]: a object"),
    ],
)
def test_attrs_that_json_would_change_are_refused_at_save_naming_them(bases, tmp_path, value, named):
    result = bases["fgpr"]
    history = result.history.copy()
    history.attrs = {**result.history.attrs, "x": value}
    with pytest.raises(InputTypeError, match=named):
        dataclasses.replace(result, history=history).save(tmp_path / "r.fedgp")
    history.attrs = {**result.history.attrs, "x": [np.float64(1.5), np.int64(2), np.bool_(True)]}
    loaded = fedgp.load(dataclasses.replace(result, history=history).save(tmp_path / "r.fedgp"))
    same(loaded.history.attrs["x"], [1.5, 2, True])  # numpy scalars are the numbers they hold


def test_a_history_column_of_another_dtype_is_refused_at_save(bases, tmp_path):
    history = bases["fgpr"].history.assign(when=pd.Timestamp("2026-01-01"))
    with pytest.raises(InputTypeError, match="history column 'when' of dtype datetime64"):
        dataclasses.replace(bases["fgpr"], history=history).save(tmp_path / "r.fedgp")


#: Header edits of a crafted (resealed) file, and what load says about each.
CRAFTED = {
    "attrs not an object": (lambda h: h.update(history_attrs=[1]), "history_attrs must be a JSON object"),
    "attrs claim transforms": (
        lambda h: h["history_attrs"].update(transforms="none"),
        "history_attrs holds 'transforms'",
    ),
    "names not strings": (lambda h: h.update(feature_names=[1, 2]), "feature_names must be strings"),
    "names repeated": (lambda h: h.update(feature_names=["a", "a"]), "'a' appear more than once"),
    "names too few": (lambda h: h.update(feature_names=["a"]), "1 feature names for 2 input columns"),
    "names too long": (lambda h: h.update(feature_names=["a", "b" * 5000]), "the limit is 4096"),
    "names not a list": (lambda h: h.update(feature_names="ab"), "feature_names must be a list"),
    "bad dtype": (
        lambda h: h["history"].update(dtypes=["complex128"] * len(h["history"]["columns"])),
        "'complex128'",
    ),
    "dtypes short": (lambda h: h["history"].update(dtypes=[]), "one dtype per column"),
    "value not of its dtype": (
        lambda h: h["history"]["data"][0].__setitem__(0, "x"),
        "history column 'round' is not int64",
    ),
    "ragged rows": (lambda h: h["history"]["data"][0].append(1), "one row of"),
    "a range of 10¹² rows": (lambda h: h["history"].update(range=[0, 10**12, 1]), "is not its index"),
    "a range beyond int64": (lambda h: h["history"].update(range=[0, 10**30, 1]), "history.range must be"),
    "10⁵ names, two alike": (
        lambda h: h.update(feature_names=[f"x{i}" for i in range(99_999)] + ["x0"]),
        "'x0' appear more than once",
    ),
    "failures index": (
        lambda h: h["failures"].update(index=[[1]] * len(h["failures"]["index"])),
        "ints and strings",
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_field_is_refused_naming_it(bases, tmp_path, case):
    edit, phrase = CRAFTED[case]
    saved = bases["fgpr"].save(tmp_path / "r.fedgp")
    with_failure = dataclasses.replace(
        bases["fgpr"], failures=pd.DataFrame([[1, 0, "x"]], columns=["round", "client", "reason"])
    )
    if case == "failures index":
        saved = with_failure.save(tmp_path / "r.fedgp")
    refused(reseal(saved, tmp_path / "crafted.fedgp", header_fn=edit), phrase)


def test_a_file_of_format_version_3_still_loads_and_says_what_it_lacks(bases, tmp_path):
    """What 0656142 wrote: no feature names, no history attrs, frames without dtypes."""
    result = dataclasses.replace(bases["fgpr"], feature_names=("u", "v"))
    from tests.export.test_saved import _read

    header, tensors = _read(result.save(tmp_path / "v4.fedgp"))
    del header["format"], header["version"], header["feature_names"], header["history_attrs"]
    for name in _references(header.pop("history_states")):  # kept states came later still (within 4)
        del tensors[name]
    for frame in ("history", "failures"):
        del header[frame]["dtypes"]
    (tmp_path / "v3.fedgp").write_bytes(seal(pack("fit-result", 3, header, tensors)))
    with pytest.warns(FallbackWarning, match=r"format version 3\), which recorded no feature names"):
        loaded = fedgp.load(tmp_path / "v3.fedgp")
    assert loaded.feature_names is None and dict(loaded.history.attrs) == {"transforms": result.transforms}
    for name, value in result.state.items():
        assert torch.equal(loaded.state[name], value)


# -- the CLI's model folder and the Flower app's output -----------------------------------------------------
def test_the_cli_model_folder_loads_to_the_run_it_printed(tmp_path, capsys):
    from fedgp.cli import main

    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {"u": rng.uniform(size=60), "v": rng.uniform(size=60), "owner": np.repeat(list("abc"), 20)}
    )
    table["y"] = np.sin(4 * table.u) + table.v + 0.05 * rng.normal(size=60)
    table.to_csv(tmp_path / "t.csv", index=False)
    argv = ["fit", str(tmp_path / "t.csv"), "--target", "y", "--group", "owner", "--rounds", "3", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "m")]) == 0
    printed = capsys.readouterr()
    model = fedgp.load(tmp_path / "m" / "model.fedgp")
    attrs = model.history.attrs
    assert attrs["stop_reason"] in printed.out and attrs["stopped"] is False and attrs["diverging"] is False
    assert "did not converge" in printed.err  # the warning the CLI printed is the verdict the file keeps
    assert model.feature_names == ("u", "v") and model.roster.ids == ["a", "b", "c"]
    history = pd.read_csv(tmp_path / "m" / "history.csv")
    np.testing.assert_array_equal(history["round"], model.history["round"])
    assert len(pd.read_csv(tmp_path / "m" / "failures.csv")) == len(model.failures) == 0


def test_the_flower_apps_output_loads_to_the_in_process_runs_fields(tmp_path):
    if os.environ.get("CI", "").strip().lower() != "true":
        pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from fedgp.data.table import read_owner_table
    from fedgp.flower import app as flower_app
    from tests.flower.test_flower_app import deploy, owner_tables

    paths = owner_tables(tmp_path)
    config = {"rounds": 3, "stop": "auto", "seed": 1, "out-dir": str(tmp_path / "out"), "eval-every": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 rounds do not converge: the verdict is what is compared
        flower_app._main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
        clients = [c for p in paths for c in read_owner_table(p, group="owner", target="y").federation()]
        settings = flower_app.AppSettings(config)
        reference = fedgp.fit(
            settings.spec(3), fedgp.data.Federation(clients), settings.strategy(), engine="sequential",
            callbacks=QUIET, **settings.fit_options(),
        )  # fmt: skip
    model = fedgp.load(tmp_path / "out" / "model.fedgp")
    attrs, expected = dict(model.history.attrs), dict(reference.history.attrs)
    kept, states = attrs.pop("states"), expected.pop("states")  # the states, as the columns: to 1e-8
    assert kept.rounds == states.rounds and kept.states.allclose(states.states, rtol=1e-8)
    same(attrs, expected, "history.attrs")
    assert model.history.attrs["stop_reason"].startswith("round budget: all 3 rounds ran")
    assert model.feature_names == reference.feature_names == ("x1", "x2", "x3")
    assert model.roster.ids == reference.roster.ids and model.seed == reference.seed == 1
    assert list(model.history.columns) == list(reference.history.columns)
    state = [c for c in reference.history.columns if "." in c]  # the hyper-parameters, round by round
    np.testing.assert_allclose(model.history[state], reference.history[state], rtol=1e-8)
    same_frame(model.failures, reference.failures)
