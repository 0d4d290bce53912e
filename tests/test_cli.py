"""The ``fedgp`` command: fit/predict on CSV files made here, their errors, --out, progress, --help."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp
import fedgp.run.progress
from fedgp.cli import _out, build_parser, default_out, main
from fedgp.data import ClientData
from fedgp.data.table import read_owner_table
from fedgp.experiments.registry import QUICK_RUNTIMES, REPRODUCTIONS
from fedgp.presets import make_spec
from fedgp.strategies import FGPR

REPO = Path(__file__).resolve().parents[1]
ROUNDS = ["--rounds", "3", "--stop", "none"]  # exactly 3 rounds (the default --stop auto would warn)
NOISE = "likelihood.noise_covar.noise"


def test_demo_writes_png_and_tables(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--rounds", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Personalisation" in out and "centralised MLE" in out
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    table = pd.read_csv(tmp_path / "personalisation.csv")
    assert list(table["client"]) == ["sin", "-sin"]
    assert len(pd.read_csv(tmp_path / "convergence_curve.csv")) == 3


def owners_frame(sizes=(10, 12, 9), seed=0) -> pd.DataFrame:
    """Three owners with their own offsets, two features on different scales, a target far from 0."""
    rng = np.random.default_rng(seed)
    parts = []
    for owner, (n, shift) in zip(["north", "south", "007"], zip(sizes, (0.0, 5.0, -5.0))):
        x1, x2 = rng.uniform(0, 10, n), rng.uniform(-100, 100, n)
        y = 50 + 4 * np.sin(x1) + 0.02 * x2 + shift + rng.normal(0, 0.3, n)
        parts.append(pd.DataFrame({"x1": x1, "x2": x2, "owner": owner, "y": y}))
    return pd.concat(parts, ignore_index=True)


@pytest.fixture
def data_csv(tmp_path) -> Path:
    path = tmp_path / "data.csv"
    owners_frame().to_csv(path, index=False)
    return path


def fit_cli(data_csv, out, *extra):
    return main(
        [
            "fit",
            str(data_csv),
            "--target",
            "y",
            "--group",
            "owner",
            *ROUNDS,
            "--quiet",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_fit_writes_model_history_metrics_and_columns(data_csv, tmp_path, capsys):
    out = tmp_path / "model"
    assert fit_cli(data_csv, out, "--kernel", "matern52", "--mean", "constant") == 0
    printed = capsys.readouterr()
    assert "3 owners, 31 rows to train on" in printed.out and printed.err == ""  # --quiet: nothing
    assert {p.name for p in out.iterdir()} == {
        "model.fedgp",
        "history.csv",
        "metrics.csv",
        "columns.json",
        "transforms.json",
        "failures.csv",
    }
    assert pd.read_csv(out / "failures.csv").empty  # no client failed
    history = pd.read_csv(out / "history.csv")
    assert len(history) == 3
    assert {  # the hyper-parameters in the data's units, lengthscales named by feature
        "likelihood.noise_covar.noise",
        "mean_module.constant",
        "covar_module.outputscale",
        "covar_module.base_kernel.lengthscale[x1]",
        "covar_module.base_kernel.lengthscale[x2]",
        "train_nll (standardised y)",  # the optimiser's objective stays in the model's units, and says so
    } <= set(history.columns)
    assert not any("raw_constant" in c or "lengthscale[0]" in c for c in history.columns)
    transforms = json.loads((out / "transforms.json").read_text())
    assert transforms["outcome"]["transform"] == "standardize" and not transforms["outcome"]["per_owner"]
    assert transforms["inputs"]["transform"] == "normalize" and list(transforms["inputs"]["lower"]) == [
        "x1",
        "x2",
    ]
    assert transforms["history_units"]["covar_module.base_kernel.lengthscale[x2]"] == "x2's units"
    metrics = pd.read_csv(out / "metrics.csv", dtype={"owner": str})
    assert metrics["owner"].tolist() == ["north", "south", "007"]  # labels are text: 007 stays 007
    assert (
        metrics["n_train"].tolist() == [10, 12, 9] and (metrics["split"] == "in-sample (training rows)").all()
    )
    columns = json.loads((out / "columns.json").read_text())
    assert (columns["features"], columns["target"], columns["group"]) == (["x1", "x2"], "y", "owner")
    model = fedgp.load(out / "model.fedgp")
    assert model.roster.ids == ["north", "south", "007"]
    kernel = model.spec.kernel.base_kernel
    assert type(kernel).__name__ == "MaternKernel" and kernel.nu == 2.5 and kernel.ard_num_dims == 2


def test_fit_is_fedgp_fit_and_predict_is_the_owners_posterior(data_csv, tmp_path, capsys):
    """The CLI's model is fedgp.fit's on the same owners, and predict conditions each row's owner on
    its rows of --data: the in-process result's personalised prediction, to 1e-10."""
    assert fit_cli(data_csv, tmp_path / "m") == 0
    table = read_owner_table(data_csv, group="owner", target="y")
    spec = make_spec(d=2)  # fedgp's defaults, the CLI's too (fedgp.defaults)
    result = fedgp.fit(spec, table.federation(), FGPR(), rounds=3, seed=0)
    saved = fedgp.load(tmp_path / "m" / "model.fedgp")
    for name, value in result.state.items():
        torch.testing.assert_close(saved.state[name], value, rtol=1e-10, atol=0)

    new = owners_frame(sizes=(2, 3, 1), seed=7).drop(columns="y").sample(frac=1.0, random_state=0)
    new.to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(data_csv)]
    assert main([*argv, "--out", str(tmp_path / "p"), "--quiet"]) == 0
    pred = pd.read_csv(tmp_path / "p" / "predictions.csv", dtype={"owner": str})
    assert pred["owner"].tolist() == new["owner"].tolist()  # NEW.csv's rows, in its order
    assert {"mean", "sd", "lower95", "upper95", "sd_f", "conditioned_on"} <= set(pred.columns)
    for owner in ["north", "south", "007"]:
        rows = pred["owner"] == owner
        mean, var = result.predict(
            pred.loc[rows, ["x1", "x2"]].to_numpy(), client=owner, observation_noise=True
        )
        np.testing.assert_allclose(pred.loc[rows, "mean"], mean.numpy(), rtol=1e-10)
        np.testing.assert_allclose(pred.loc[rows, "sd"], var.sqrt().numpy(), rtol=1e-10)
    z = (pred["upper95"] - pred["mean"]) / pred["sd"]
    np.testing.assert_allclose(z, 1.959963984540054, rtol=1e-9)
    np.testing.assert_allclose(pred["mean"] - pred["lower95"], pred["upper95"] - pred["mean"], rtol=1e-9)
    assert (pred["sd_f"] < pred["sd"]).all()
    assert pred.groupby("owner")["conditioned_on"].first().to_dict() == {"north": 10, "south": 12, "007": 9}


def test_fit_with_personal_noise_is_fedgp_fit_and_predict_gives_each_owner_its_own(data_csv, tmp_path):
    """``--personal noise``: fedgp.fit(FGPR(personal=("noise",))) on the same owners; the folder holds
    each owner's noise, and predict conditions each owner under its own (to 1e-10). An unknown name,
    a name given to ifca, and --personal with --warm-start are refused."""
    assert fit_cli(data_csv, tmp_path / "m", "--personal", "noise") == 0
    table = read_owner_table(data_csv, group="owner", target="y")
    result = fedgp.fit(make_spec(d=2), table.federation(), FGPR(personal=("noise",)), rounds=3, seed=0)
    saved = fedgp.load(tmp_path / "m" / "model.fedgp")
    kept, ours = result.personal_values(), saved.personal_values()
    assert set(kept) == set(ours) == {"north", "south", "007"}
    assert len({float(v[NOISE]) for v in ours.values()}) == 3  # each owner's own noise
    for owner in kept:
        torch.testing.assert_close(ours[owner][NOISE], kept[owner][NOISE], rtol=1e-10, atol=0)
    new = owners_frame(sizes=(2, 3, 1), seed=7).drop(columns="y")
    new.to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(data_csv)]
    assert main([*argv, "--out", str(tmp_path / "p"), "--quiet"]) == 0
    pred = pd.read_csv(tmp_path / "p" / "predictions.csv", dtype={"owner": str})
    for owner in ["north", "south", "007"]:
        rows = pred["owner"] == owner
        X = pred.loc[rows, ["x1", "x2"]].to_numpy()
        mean, var = result.predict(X, client=owner, observation_noise=True)
        np.testing.assert_allclose(pred.loc[rows, "mean"], mean.numpy(), rtol=1e-10)
        np.testing.assert_allclose(pred.loc[rows, "sd"], var.sqrt().numpy(), rtol=1e-10)
    assert fit_cli(data_csv, tmp_path / "a", "--personal", "smoothness") == 2
    assert fit_cli(data_csv, tmp_path / "b", "--personal", "noise", "--strategy", "ifca") == 2
    assert fit_cli(data_csv, tmp_path / "c", "--personal", "noise", "--warm-start", str(tmp_path / "m")) == 2


def test_held_out_metrics_are_evaluate(data_csv, tmp_path):
    assert fit_cli(data_csv, tmp_path / "m", "--test-fraction", "0.3") == 0
    metrics = pd.read_csv(tmp_path / "m" / "metrics.csv", dtype={"owner": str})
    assert (metrics["split"] == "held-out").all() and metrics["n_test"].tolist() == [3, 4, 3]
    assert (metrics["n_train"] + metrics["n_test"]).tolist() == [10, 12, 9]
    table = read_owner_table(data_csv, group="owner", target="y")
    spec = make_spec(d=2)
    result = fedgp.fit(spec, table.federation(0.3, seed=0), FGPR(), rounds=3, seed=0)
    np.testing.assert_allclose(metrics["rmse"], result.evaluate()["rmse"], rtol=1e-10)
    assert metrics["owner"].tolist() == ["north", "south", "007"]  # the group column's values, not 0..K-1


def test_owners_are_the_group_columns_values_in_every_output(data_csv, tmp_path):
    """metrics.csv (held out, a clustered strategy), columns.json, the model and predictions.csv name
    each owner by its label in the --group column, never by its position."""
    assert fit_cli(data_csv, tmp_path / "m", "--strategy", "ifca", "--test-fraction", "0.3") == 0
    owners = ["north", "south", "007"]
    metrics = pd.read_csv(tmp_path / "m" / "metrics.csv", dtype={"owner": str})
    assert metrics["owner"].tolist() == owners and set(metrics["cluster"]) <= {0, 1}
    assert json.loads((tmp_path / "m" / "columns.json").read_text())["owners"] == owners
    assert fedgp.load(tmp_path / "m" / "model.fedgp").roster.ids == owners
    pd.DataFrame({"x1": [1.0, 2.0], "x2": [0.0, 1.0], "owner": ["007", "south"]}).to_csv(
        tmp_path / "new.csv", index=False
    )
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(data_csv), "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "p")]) == 0
    pred = pd.read_csv(tmp_path / "p" / "predictions.csv", dtype={"owner": str})
    assert pred["owner"].tolist() == ["007", "south"] and pred["conditioned_on"].tolist() == [9, 12]


# -- history.csv in the data's units -----------------------------------------------------------------


def test_history_is_in_the_datas_units(tmp_path):
    """The same table with y scaled by 1000 and x by 16: the test RMSE, the data-unit constant mean
    and the noise and signal variances scale by 1000, 1000 and 1e6, the lengthscales by 16, and the
    columns left in the model's units (the training NLL of the standardised y) do not change. (16, a
    power of two, so that the federated unit-cube bounds, widened to a power-of-two grid, scale
    exactly too: with 10 the grid, hence the fit, would differ a little.)"""
    frame = owners_frame()
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.assign(y=frame["y"] * 1000, x1=frame["x1"] * 16, x2=frame["x2"] * 16).to_csv(
        tmp_path / "b.csv", index=False
    )
    for name in ("a", "b"):
        assert (
            fit_cli(tmp_path / f"{name}.csv", tmp_path / name, "--test-fraction", "0.3", "--mean", "constant")
            == 0
        )
    a, b = (pd.read_csv(tmp_path / name / "history.csv") for name in ("a", "b"))
    assert list(a.columns) == list(b.columns)
    factors = {
        "test_rmse_mean": 1000,
        "test_rmse_std": 1000,
        "mean_module.constant": 1000,
        "likelihood.noise_covar.noise": 1e6,
        "covar_module.outputscale": 1e6,
        "covar_module.base_kernel.lengthscale[x1]": 16,
        "covar_module.base_kernel.lengthscale[x2]": 16,
        "train_nll (standardised y)": 1,
    }
    for column, factor in factors.items():
        np.testing.assert_allclose(b[column], factor * a[column], rtol=1e-6, err_msg=column)
    np.testing.assert_allclose(b["test_nll_mean"], a["test_nll_mean"] + np.log(1000), rtol=1e-6)
    ta, tb = (json.loads((tmp_path / name / "transforms.json").read_text()) for name in ("a", "b"))
    assert tb["outcome"]["sd"] == pytest.approx(1000 * ta["outcome"]["sd"], rel=1e-12)
    assert tb["inputs"]["upper"]["x2"] == 16 * ta["inputs"]["upper"]["x2"]


@pytest.mark.parametrize("mean, ard", [("constant", "--ard"), ("linear", "--no-ard")])
def test_history_hyperparameters_are_the_same_gp_in_the_datas_units(data_csv, tmp_path, mean, ard):
    """A plain GPyTorch GP on an owner's raw rows, with the last history row's data-unit values
    (a shared lengthscale becomes one per feature; a linear mean's weights and bias), predicts what
    the saved model predicts for that owner: the conversion is exact, not only right in scale."""
    import gpytorch

    assert fit_cli(data_csv, tmp_path / "m", "--mean", mean, ard) == 0
    last = pd.read_csv(tmp_path / "m" / "history.csv").iloc[-1]
    model = fedgp.load(tmp_path / "m" / "model.fedgp")
    client = read_owner_table(data_csv, group="owner", target="y").federation()[1]
    X_new = torch.tensor([[1.0, -50.0], [5.0, 0.0], [9.5, 80.0]], dtype=torch.float64)

    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = float(last["likelihood.noise_covar.noise"])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)).double()
    kernel.outputscale = float(last["covar_module.outputscale"])
    kernel.base_kernel.lengthscale = torch.tensor(
        [[last["covar_module.base_kernel.lengthscale[x1]"], last["covar_module.base_kernel.lengthscale[x2]"]]]
    )
    if mean == "constant":
        mean_module = gpytorch.means.ConstantMean().double()
        mean_module.constant = float(last["mean_module.constant"])
    else:
        mean_module = gpytorch.means.LinearMean(2).double()
        mean_module.weights.data = torch.tensor(
            [[last["mean_module.weights[x1]"]], [last["mean_module.weights[x2]"]]], dtype=torch.float64
        )
        mean_module.bias.data = torch.tensor([last["mean_module.bias"]], dtype=torch.float64)

    class GP(gpytorch.models.ExactGP):
        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(mean_module(x), kernel(x))

    gp = GP(client.X, client.y, likelihood).eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        expected = likelihood(gp(X_new))
    pred = model.posterior(X_new, client)
    torch.testing.assert_close(pred.mean, expected.mean, rtol=1e-8, atol=0)
    # the variance is a small difference of large terms, computed in other units: to 1e-6
    torch.testing.assert_close(pred.variance_y, expected.variance, rtol=1e-6, atol=0)


def test_predict_from_the_prior_for_owners_without_rows(data_csv, tmp_path, capsys):
    assert fit_cli(data_csv, tmp_path / "m", "--strategy", "ifca", "--clusters", "2") == 0
    new = pd.DataFrame(
        {"x1": [1.0, 2.0, 3.0], "x2": [0.0, 10.0, -10.0], "owner": ["newcomer", "north", "newcomer"]}
    )
    new.to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(data_csv), "--quiet"]
    assert main([*argv, "--unknown", "prior", "--out", str(tmp_path / "p")]) == 0
    pred = pd.read_csv(tmp_path / "p" / "predictions.csv")
    assert pred["conditioned_on"].tolist() == [0, 10, 0]
    model = fedgp.load(tmp_path / "m" / "model.fedgp")
    cold = ClientData(np.empty((0, 2)), np.empty(0), id="newcomer")
    expected = model.posterior(new.loc[[0, 2], ["x1", "x2"]].to_numpy(), cold)
    np.testing.assert_allclose(pred.loc[[0, 2], "mean"], expected.mean.numpy(), rtol=1e-10)


def test_an_owner_only_in_data_is_predicted_as_a_new_owner(data_csv, tmp_path, capsys):
    assert fit_cli(data_csv, tmp_path / "m") == 0
    extra = owners_frame(sizes=(4, 2, 2), seed=3).replace({"owner": {"north": "east"}})
    extra.to_csv(tmp_path / "more.csv", index=False)
    extra.drop(columns="y").iloc[:2].to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(tmp_path / "more.csv")]
    assert main([*argv, "--out", str(tmp_path / "p")]) == 0
    assert "owner 'east' was not among the model's training owners" in capsys.readouterr().err
    assert pd.read_csv(tmp_path / "p" / "predictions.csv")["conditioned_on"].tolist() == [4, 4]


def _malformed(frame: pd.DataFrame, case: str) -> pd.DataFrame:
    frame = frame.astype({"x1": object, "y": object})
    if case == "text cell":
        frame.loc[4, "x1"] = "4,7"  # a decimal comma, quoted by to_csv
    elif case == "empty cell":
        frame.loc[6, "y"] = None
    elif case == "inf":
        frame.loc[2, "x1"] = "inf"
    elif case == "one-row owner":
        frame = pd.concat([frame, frame.iloc[[0]].assign(owner="lonely")], ignore_index=True)
    elif case == "no owner":
        frame.loc[3, "owner"] = None
    return frame


@pytest.mark.parametrize(
    "case, argv, message",
    [
        (
            "fine",
            ["--target", "z"],
            r"data\.csv: no column 'z' \(--target\); its columns are 'x1', 'x2', 'owner', 'y'",
        ),
        ("fine", ["--group", "site"], r"data\.csv: no column 'site' \(--group\)"),
        ("fine", ["--features", "x1", "x3"], r"data\.csv: no column 'x3' \(--features\)"),
        ("text cell", [], r"data\.csv: column 'x1', line 6 \(owner 'north'\): '4,7' is not a number"),
        ("empty cell", [], r"data\.csv: column 'y', line 8 \(owner 'north'\): missing value"),
        ("inf", [], r"data\.csv: column 'x1', line 4 \(owner 'north'\): inf is not a finite number"),
        ("no owner", [], r"data\.csv: column 'owner', line 5: no owner"),
        (
            "one-row owner",
            [],
            r"data\.csv: owner 'lonely' has 1 row\(s\) \(line 33\); training needs at least 2 per owner",
        ),
        ("fine", ["--test-fraction", "1.5"], r"test fraction must be in \(0, 1\)"),
        ("fine", ["--strategy", "fgpr", "--lr", "-1"], r"FGPR: lr must be a finite number > 0"),
    ],
)
def test_a_malformed_table_is_one_clear_line(tmp_path, capsys, case, argv, message):
    path = tmp_path / "data.csv"
    _malformed(owners_frame(), case).to_csv(path, index=False)
    base = ["fit", str(path), "--target", "y", "--group", "owner", *ROUNDS, "--out", str(tmp_path / "m")]
    args = base + argv
    for flag in ("--target", "--group"):  # a flag given twice: the test's value wins
        if flag in argv:
            i = args.index(flag)
            del args[i : i + 2]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert err.startswith("fedgp fit: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists()  # nothing written


def test_constant_target_of_an_owner_is_named(tmp_path, capsys):
    frame = owners_frame()
    frame.loc[frame["owner"] == "south", "y"] = 3.0
    frame.to_csv(tmp_path / "data.csv", index=False)
    assert fit_cli(tmp_path / "data.csv", tmp_path / "m") == 2
    assert re.search(r"data\.csv: client 'south': y is constant", capsys.readouterr().err)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, r"nowhere\.csv: no such file"),
        ("", r"empty\.csv: cannot be read as a CSV table"),
        ("x1,owner,y\n", "header but no rows"),
    ],
)
def test_unreadable_files_are_named(tmp_path, capsys, content, message):
    name = "nowhere.csv" if content is None else ("empty.csv" if content == "" else "header.csv")
    if content is not None:
        (tmp_path / name).write_text(content)
    assert fit_cli(tmp_path / name, tmp_path / "m") == 2
    assert re.search(message, capsys.readouterr().err)


def test_predict_refuses_unknown_owners_and_names_them(data_csv, tmp_path, capsys):
    assert fit_cli(data_csv, tmp_path / "m") == 0
    pd.DataFrame({"x1": [1.0, 2.0], "x2": [0.0, 1.0], "owner": ["north", "west"]}).to_csv(
        tmp_path / "new.csv", index=False
    )
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--out", str(tmp_path / "p")]
    assert main([*argv, "--data", str(data_csv)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"new\.csv: owner 'west' \(line 3\) has no rows in .*data\.csv", err), err
    assert "--unknown prior" in err and "'north', 'south', '007'" in err and "Traceback" not in err
    assert main(argv) == 2  # no --data at all: every owner is unknown
    assert re.search(
        r"owners 'north' \(line 2\), 'west' \(line 3\) have no data: no --data was given",
        capsys.readouterr().err,
    )
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "setup, message",
    [
        ("no folder", r"no such folder"),
        ("not a model", r"not a folder written by fedgp fit"),
        ("missing feature", r"new\.csv: no column 'x2' \(the model's features\)"),
        ("text cell", r"new\.csv: column 'x2', line 2 \(owner 'north'\): 'high' is not a number"),
    ],
)
def test_predict_input_errors(data_csv, tmp_path, capsys, setup, message):
    model = tmp_path / "m"
    if setup == "not a model":
        model.mkdir()
    elif setup != "no folder":
        assert fit_cli(data_csv, model) == 0
    new = pd.DataFrame({"x1": [1.0], "x2": ["high" if setup == "text cell" else "1.0"], "owner": ["north"]})
    (new.drop(columns="x2") if setup == "missing feature" else new).to_csv(tmp_path / "new.csv", index=False)
    capsys.readouterr()
    argv = [
        "predict",
        str(model),
        str(tmp_path / "new.csv"),
        "--data",
        str(data_csv),
        "--out",
        str(tmp_path / "p"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.startswith("fedgp predict: "), err


# -- --out, progress, --help ------------------------------------------------------------------------


def test_out_defaults_to_a_new_timestamped_folder_never_results(data_csv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", str(data_csv), "--target", "y", "--group", "owner", *ROUNDS, "--quiet"]) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("fedgp-fit-")]
    assert re.fullmatch(r"fedgp-fit-\d{8}-\d{6}", folder.name) and (folder / "model.fedgp").exists()
    assert f"wrote {folder}" in capsys.readouterr().out
    for argv in (["reproduce", "table2"], ["demo"], ["predict", "m", "new.csv"]):
        args = build_parser().parse_args(argv)
        assert args.out is None
        out = _out(args)
        assert (
            out.parent == tmp_path and out.name.startswith(f"fedgp-{argv[0]}-") and "results" not in out.parts
        )
    import datetime

    now = datetime.datetime(2026, 11, 26, 15, 45, 1)
    (tmp_path / "fedgp-demo-20261126-154501").mkdir()  # taken: the next run gets its own folder
    assert default_out("demo", now).name == "fedgp-demo-20261126-154501-2"


def test_progress_lines_without_a_terminal_and_quiet(data_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fedgp.run.progress, "MIN_SECONDS", 0.0)
    argv = ["fit", str(data_csv), "--target", "y", "--group", "owner", "--rounds", "20", "--stop", "none"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    lines = capsys.readouterr().err.splitlines()  # pytest's stderr is not a terminal
    assert re.match(r"in-sample metrics: 3/3 \[", lines.pop())  # then the per-owner metrics' line
    assert [int(re.match(r"FGPR: (\d+)/20 \[", line).group(1)) for line in lines] == [
        2,
        4,
        6,
        8,
        10,
        12,
        14,
        16,
        18,
        20,
    ]
    assert all("train_nll=" in line for line in lines)
    assert main([*argv, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_a_fit_that_does_not_converge_says_so_in_one_line(data_csv, tmp_path, capsys):
    """--stop auto is the default: a budget too small to converge in is a one-line warning."""
    assert build_parser().parse_args(["fit", "d.csv", "--target", "y", "--group", "g"]).stop == "auto"
    argv = ["fit", str(data_csv), "--target", "y", "--group", "owner", "--rounds", "3", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "fedgp fit: warning: training did not converge within --rounds 3"
    )
    # Said to a command-line user: what to change in the command, and the file to read.
    assert "Raise --rounds" in err[0] and str(tmp_path / "m" / "history.csv") in err[0]
    assert "result.history" not in err[0] and "local_steps" not in err[0]
    history = pd.read_csv(tmp_path / "m" / "history.csv")
    assert len(history) == 3 and {"stop_state_change", "stop_nll_rise"} <= set(history.columns)


def test_a_run_stopped_early_ends_its_progress_at_100_percent(data_csv, tmp_path, capsys, monkeypatch):
    """A learning rate too small to move the state: --stop auto (the default) ends the run after
    about 10 of its 100 rounds, and the last progress line is N/N, not N/100."""
    monkeypatch.setattr(fedgp.run.progress, "MIN_SECONDS", 0.0)
    argv = ["fit", str(data_csv), "--target", "y", "--group", "owner", "--lr", "1e-9"]
    assert main([*argv, "--out", str(tmp_path / "m")]) == 0
    captured = capsys.readouterr()
    ran = len(pd.read_csv(tmp_path / "m" / "history.csv"))
    assert 10 <= ran < 100 and f"round {ran}: " in captured.out  # the stop reason is printed
    lines = [line for line in captured.err.splitlines() if not line.startswith("in-sample metrics: ")]
    assert lines[0].startswith("FGPR: 10/100 [") and lines[-1].startswith(f"FGPR: {ran}/{ran} [")
    assert "warning" not in captured.err


def test_end_early_makes_the_last_line_and_the_bar_end_at_100_percent():
    """The line display whose last line was due on the round a stop fired (20/100) writes one more,
    20/20; a tqdm bar ends showing 20/20; a disabled bar is left alone."""
    import io

    from tqdm import tqdm

    from fedgp.run.progress import LineProgress, end_early, progress_bar

    stream = io.StringIO()
    bar = LineProgress(total=100, desc="FGPR", file=stream, every=10, min_seconds=0)
    bar.update(20)
    end_early(bar)
    bar.close()
    assert [line.split(" [")[0] for line in stream.getvalue().splitlines()] == ["FGPR: 20/100", "FGPR: 20/20"]
    stream = io.StringIO()
    bar = tqdm(total=100, desc="FGPR", file=stream, leave=True)  # the bar a terminal shows
    bar.update(12)
    end_early(bar)
    bar.close()
    assert "12/12" in stream.getvalue().split("\r")[-1] and "100%" in stream.getvalue().split("\r")[-1]
    quiet = progress_bar(total=100, desc="FGPR", progress=False)
    quiet.update(12)
    end_early(quiet)
    assert quiet.total == 100


def test_reproduce_says_what_to_expect_and_names_missing_inputs(tmp_path, capsys):
    assert main(["reproduce", "verdicts", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("fedgp reproduce verdicts: started; --quick: ")
    assert err[1].startswith("fedgp reproduce: verdicts: none of table1.csv") and len(err) == 2
    assert main(["reproduce", "verdicts", "--out", str(tmp_path), "--quiet"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_every_reproduction_states_its_measured_quick_runtime(capsys):
    """--help names every experiment with its quick-mode time, and the figures are the ones in the
    committed measurement (benchmarks/cli_quick_times.py, results/benchmarks/cli_quick_times.csv)."""
    assert set(QUICK_RUNTIMES) == set(REPRODUCTIONS) | {"demo"}
    measured = pd.read_csv(REPO / "results" / "benchmarks" / "cli_quick_times.csv").set_index("name")
    assert (measured["returncode"] == 0).all()
    for name, (cpu_min, wall_min, load) in QUICK_RUNTIMES.items():
        row = measured.loc[name]
        measured_here = [row["cpu_s"] / 60, row["wall_s"] / 60, max(row["load1_before"], row["load1_after"])]
        assert [cpu_min, wall_min, load] == pytest.approx(measured_here, abs=0.051), name  # to 0.1
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    for name, (cpu_min, wall_min, _) in QUICK_RUNTIMES.items():
        if name != "demo":
            assert re.search(
                rf"{re.escape(name)} .*?--quick: {cpu_min:g} min CPU, {wall_min:g} min wall", text
            ), name
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    cpu_min, wall_min, _ = QUICK_RUNTIMES["demo"]
    assert f"{cpu_min:g} min CPU, {wall_min:g} min wall" in re.sub(r"\s+", " ", capsys.readouterr().out)


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--seed", "-1"], ["--rounds", "ten"]])
def test_bad_numbers_are_refused_by_the_parser(data_csv, tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as caught:
        main(["fit", str(data_csv), "--target", "y", "--group", "owner", *argv, "--out", str(tmp_path / "m")])
    assert caught.value.code == 2
    assert f"argument {argv[0]}: must be an integer" in capsys.readouterr().err


def test_a_missing_extra_is_one_line_naming_the_install(tmp_path, capsys, monkeypatch):
    """Parquet without pyarrow: exit 2 and the pip line, not a traceback."""
    path = tmp_path / "data.parquet"
    path.write_bytes(b"PAR1")

    def no_pyarrow(*args, **kwargs):
        raise ImportError("Unable to find a usable engine; tried using: 'pyarrow'")

    monkeypatch.setattr(pd, "read_parquet", no_pyarrow)
    assert main(["fit", str(path), "--target", "y", "--group", "owner", *ROUNDS, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'pip install "fedgp-gpytorch[parquet]"' in err[0] and str(path) in err[0]


def test_a_tab_separated_table_fits_and_a_text_column_points_to_features(tmp_path, capsys):
    """Issue 49: a TSV reads as its CSV twin (it reported "no column" and one tab-joined column), and
    a text column read as a feature by default says to choose the features with --features."""
    owners_frame().to_csv(tmp_path / "data.tsv", sep="\t", index=False)
    assert fit_cli(tmp_path / "data.tsv", tmp_path / "m") == 0
    assert json.loads((tmp_path / "m" / "columns.json").read_text())["features"] == ["x1", "x2"]
    capsys.readouterr()
    owners_frame().assign(site="plant").to_csv(tmp_path / "site.csv", index=False)
    _one_line_exit_2(
        capsys,
        [
            "fit",
            str(tmp_path / "site.csv"),
            "--target",
            "y",
            "--group",
            "owner",
            *ROUNDS,
            "--out",
            str(tmp_path / "s"),
        ],
        r"column 'site', line 2 \(owner 'north'\): 'plant' is not a number; a feature must be a number: "
        r"choose the feature columns with --features",
    )
    assert fit_cli(tmp_path / "site.csv", tmp_path / "s", "--features", "x1", "x2") == 0


# -- issue 35, item 5: the command line's own boundaries --------------------------------------------


@pytest.mark.parametrize(
    "header, named",
    [("x1,x2,y,y,owner", r"column 'y' more than once"), ("x1,x1,y,owner", r"column 'x1' more than once")],
)
def test_a_repeated_header_is_refused_naming_the_column_and_the_file(tmp_path, capsys, header, named):
    rows = ["1,2,3,3,a", "2,3,4,4,a", "3,4,5,5,b", "4,5,6,6,b"] if header.count(",") == 4 else [
        "1,1,3,a", "2,2,4,a", "3,3,5,b", "4,4,6,b"
    ]  # fmt: skip
    (tmp_path / "dup.csv").write_text("\n".join([header, *rows]) + "\n")
    assert fit_cli(tmp_path / "dup.csv", tmp_path / "m") == 2
    err = capsys.readouterr().err
    assert re.search(r"dup\.csv: the header names " + named, err) and len(err.splitlines()) == 1, err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("name", ["NA", "None", "null", "nan", "N/A", "-nan", "<NA>"])
def test_an_owner_named_like_a_missing_value_keeps_its_name(tmp_path, capsys, name):
    frame = owners_frame()
    frame["owner"] = frame["owner"].replace({"south": name})
    frame.to_csv(tmp_path / "data.csv", index=False)
    assert fit_cli(tmp_path / "data.csv", tmp_path / "m") == 0
    metrics = pd.read_csv(tmp_path / "m" / "metrics.csv", dtype={"owner": str}, keep_default_na=False)
    assert list(metrics["owner"]) == ["north", name, "007"]
    assert json.loads((tmp_path / "m" / "columns.json").read_text())["owners"] == ["north", name, "007"]
    pd.DataFrame({"x1": [1.0], "x2": [0.0], "owner": [name]}).to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(tmp_path / "data.csv")]
    assert main([*argv, "--out", str(tmp_path / "p"), "--quiet"]) == 0
    predictions = pd.read_csv(tmp_path / "p" / "predictions.csv", keep_default_na=False)
    assert list(predictions["owner"]) == [name] and predictions["conditioned_on"].tolist() == [12]


def test_an_empty_owner_cell_is_still_refused_but_missing_numbers_still_are_missing(tmp_path, capsys):
    frame = owners_frame().astype({"owner": object, "x2": object})
    frame.loc[3, "owner"] = ""
    frame.to_csv(tmp_path / "a.csv", index=False)
    assert fit_cli(tmp_path / "a.csv", tmp_path / "m") == 2
    assert re.search(r"a\.csv: column 'owner', line 5: no owner \(empty cell\)", capsys.readouterr().err)
    frame = owners_frame().astype({"x2": object})
    frame.loc[3, "x2"] = "NA"
    frame.to_csv(tmp_path / "b.csv", index=False)
    assert fit_cli(tmp_path / "b.csv", tmp_path / "m") == 2
    assert re.search(r"b\.csv: column 'x2', line 5 \(owner 'north'\): missing value", capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "owner", "--group", "owner"], r"--target and --group both name column 'owner'"),
        (["--target", "y", "--group", "owner", "--features", "x1", "y"], r"'y' cannot be both a feature"),
        (["--target", "y", "--group", "owner", "--features", "owner"], r"'owner' cannot be both a feature"),
    ],
)
def test_a_column_in_two_roles_is_refused_by_name(data_csv, tmp_path, capsys, argv, message):
    assert main(["fit", str(data_csv), *argv, *ROUNDS, "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and len(err.splitlines()) == 1 and "Traceback" not in err, err


def _one_line_exit_2(capsys, argv, message) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.err), captured.err
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err


def test_every_failure_of_the_issue_is_one_line_with_exit_2(data_csv, tmp_path, capsys):
    """Issue 35's CLI cases: --out naming a file, 1e200 in NEW.csv; tiny targets fit (issue 51)."""
    tiny = owners_frame().assign(y=lambda f: f["y"] * 1e-200)
    tiny.to_csv(tmp_path / "tiny.csv", index=False)
    fit = ["fit", "--target", "y", "--group", "owner", *ROUNDS, "--quiet", "--out"]
    assert main([*fit, str(tmp_path / "t"), str(tmp_path / "tiny.csv")]) == 0
    capsys.readouterr()
    (tmp_path / "a-file").write_text("mine")
    _one_line_exit_2(
        capsys, [*fit, str(tmp_path / "a-file"), str(data_csv)], r"a-file is a file, not a folder"
    )
    assert (tmp_path / "a-file").read_text() == "mine"
    assert fit_cli(data_csv, tmp_path / "m") == 0
    pd.DataFrame({"x1": [1e200], "x2": [0.0], "owner": ["north"]}).to_csv(tmp_path / "new.csv", index=False)
    predict = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(data_csv)]
    _one_line_exit_2(capsys, [*predict, "--out", str(tmp_path / "p")], r"new\.csv: .*1e\+200")
    _one_line_exit_2(capsys, [*predict, "--out", str(tmp_path / "a-file")], r"a-file is a file, not a folder")


def test_a_fedgp_error_escaping_a_command_is_one_line(data_csv, tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise fedgp.errors.RoundFailedError("round 1 failed:\nevery client failed", failures={0: "boom"})

    monkeypatch.setattr(fedgp.run, "fit", fail)
    out = str(tmp_path / "m")
    argv = ["fit", str(data_csv), "--target", "y", "--group", "owner", "--quiet", "--out", out]
    _one_line_exit_2(capsys, argv, r"^fedgp fit: round 1 failed:; every client failed")


def test_out_is_never_overwritten_without_force(data_csv, tmp_path, capsys, monkeypatch):
    out = tmp_path / "m"
    out.mkdir()
    (out / "history.csv").write_text("mine\n")
    (out / "notes.txt").write_text("mine\n")
    calls = []
    monkeypatch.setattr(fedgp.run, "fit", lambda *a, **k: calls.append(1))  # refused before any fit
    fit = ["fit", str(data_csv), "--target", "y", "--group", "owner", "--out", str(out)]
    _one_line_exit_2(capsys, fit, r"m already holds history\.csv, which this command would overwrite.*force")
    assert calls == [] and (out / "history.csv").read_text() == "mine\n"
    monkeypatch.undo()
    assert fit_cli(data_csv, out, "--force") == 0
    assert (out / "history.csv").read_text() != "mine\n" and (out / "notes.txt").read_text() == "mine\n"
    every = (
        r"already holds model\.fedgp, history\.csv, transforms\.json, metrics\.csv, failures\.csv, "
        r"columns\.json"
    )
    _one_line_exit_2(capsys, fit, every)
    pd.DataFrame({"x1": [1.0], "x2": [0.0], "owner": ["north"]}).to_csv(tmp_path / "new.csv", index=False)
    predict = ["predict", str(out), str(tmp_path / "new.csv"), "--data", str(data_csv), "--quiet", "--out"]
    assert main([*predict, str(tmp_path / "p")]) == 0
    before = (tmp_path / "p" / "predictions.csv").read_bytes()
    _one_line_exit_2(capsys, [*predict, str(tmp_path / "p")], r"p already holds predictions\.csv")
    monkeypatch.setattr(fedgp.files.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    _one_line_exit_2(capsys, [*predict, str(tmp_path / "p"), "--force"], r"^fedgp predict: disk full")
    assert (tmp_path / "p" / "predictions.csv").read_bytes() == before  # atomic: the old file, whole
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["predictions.csv"]  # no temporary left
    monkeypatch.undo()
    assert main([*predict, str(tmp_path / "p"), "--force"]) == 0


def test_batched_in_sample_metrics_are_the_owner_by_owner_posteriors(data_csv):
    from fedgp.commands import fit_metrics
    from fedgp.layout import owner_metrics

    federation = read_owner_table(data_csv, group="owner", target="y").federation()
    result = fedgp.fit(make_spec("rbf", "constant", d=2), federation, FGPR(), rounds=3, engine="batched")
    fast, slow = fit_metrics(result, federation, False, False), owner_metrics(result, federation, False)
    pd.testing.assert_frame_equal(fast, slow, check_dtype=False, rtol=1e-9)


def test_progress_of_the_per_owner_loops(data_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fedgp.run.progress, "MIN_SECONDS", 0.0)
    for engine in ("batched", "sequential"):
        argv = ["fit", str(data_csv), "--target", "y", "--group", "owner", *ROUNDS, "--engine", engine]
        assert main([*argv, "--out", str(tmp_path / engine)]) == 0
        assert re.search(r"^in-sample metrics: 3/3 \[", capsys.readouterr().err, re.M)
    pd.DataFrame({"x1": [1.0, 2.0], "x2": [0.0, 1.0], "owner": ["north", "south"]}).to_csv(
        tmp_path / "new.csv", index=False
    )
    predict = ["predict", str(tmp_path / "batched"), str(tmp_path / "new.csv"), "--data", str(data_csv)]
    assert main([*predict, "--out", str(tmp_path / "p")]) == 0
    assert re.search(r"^predict: 2/2 \[", capsys.readouterr().err, re.M)
    assert main([*predict, "--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_many_owners_print_at_most_twenty_metrics_lines(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x = rng.uniform(size=(60, 2))
    frame = pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "y": x.sum(1) + rng.normal(0, 0.1, 60)})
    frame.assign(owner=[f"o{i // 2}" for i in range(60)]).to_csv(tmp_path / "many.csv", index=False)
    assert fit_cli(tmp_path / "many.csv", tmp_path / "m") == 0
    out = capsys.readouterr().out
    assert "30 owners" in out and " o0 " in out and "o29" in out and " o15 " not in out, out
    assert len(pd.read_csv(tmp_path / "m" / "metrics.csv")) == 30


def test_a_model_sealed_with_a_key_file_needs_the_same_key(data_csv, tmp_path, capsys):
    """--key-file seals model.fedgp with HMAC-SHA256; predict without the key, with another, or
    with an empty key file is one line and exit 2; with the key it predicts as fedgp.load(key=)."""
    (tmp_path / "key").write_bytes(b"owners' shared secret\n")
    (tmp_path / "other").write_bytes(b"another secret")
    (tmp_path / "empty").write_bytes(b"\n")
    assert fit_cli(data_csv, tmp_path / "m", "--key-file", str(tmp_path / "key")) == 0
    assert (tmp_path / "m" / "model.fedgp").read_bytes().startswith(b"FEDGP hmac-sha256=")
    owners_frame().drop(columns="y").iloc[:3].to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(data_csv), "--quiet"]
    capsys.readouterr()
    for extra, message in (
        ([], "written with a key"),
        (["--key-file", str(tmp_path / "other")], "does not match"),
        (["--key-file", str(tmp_path / "empty")], "the file is empty"),
        (["--key-file", str(tmp_path / "missing")], "cannot be read"),
    ):
        assert main([*argv, *extra, "--out", str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err
    assert main([*argv, "--key-file", str(tmp_path / "key"), "--out", str(tmp_path / "p")]) == 0
    model = fedgp.load(tmp_path / "m" / "model.fedgp", key=b"owners' shared secret")
    assert len(pd.read_csv(tmp_path / "p" / "predictions.csv")) == 3 and model.state is not None


def test_the_linear_mean_starts_at_zero_whatever_torchs_seed():
    # GPyTorch draws LinearMean's start from torch's generator, seeded differently in every
    # process: fedgp fit --mean linear --seed 0 must start (and end) at the same place each time.
    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        states.append(dict(make_spec("rbf", "linear", d=3).initial_state().items()))
    assert torch.equal(states[0]["mean_module.weights"], torch.zeros(3, 1, dtype=torch.float64))
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.parametrize(
    "kind, cell",
    [("datetime", "'2024-01-05 00:00:00' is a date and time"), ("date", "'2024-01-05' is a date"),
     ("timedelta", "'1 days 00:00:00' is a duration")],
)  # fmt: skip
def test_a_parquet_date_column_is_one_line_naming_it(tmp_path, capsys, kind, cell):
    """Issue 51: ``fedgp fit`` on a Parquet file with a date, time or duration column exits 2 with one
    line naming the file and the column (it fitted the dates as microseconds since 1970)."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    days = [datetime.date(2024, 1, d) for d in range(5, 11)]
    when = {
        "datetime": pa.array(pd.to_datetime(days)),
        "date": pa.array(days, type=pa.date32()),
        "timedelta": pa.array(pd.to_timedelta(range(1, 7), unit="D")),
    }[kind]
    path = tmp_path / "dated.parquet"
    owners = ["a", "a", "a", "b", "b", "b"]
    pq.write_table(pa.table({"owner": owners, "when": when, "y": [1.0, 3.0, 2.0, 5.0, 4.0, 6.0]}), path)
    out = tmp_path / "m"
    assert (
        main(["fit", str(path), "--target", "y", "--group", "owner", *ROUNDS, "--out", str(out), "--quiet"])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"fedgp fit: {path}: column 'when', line 2 (owner 'a'): {cell}, not a number; ")
    assert "convert the column to numbers first" in err[0] and "--features" in err[0]
    assert not out.exists()
