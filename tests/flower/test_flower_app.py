"""fedgp's own Flower app (``fedgp.flower.app``), configured by run config and node config only:
three nodes, each reading its owners' rows from its own CSV file of 3-feature data, over an
in-memory grid. The ServerApp's output folder is what ``fedgp fit`` writes, and its saved model
predicts as the in-process run does."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp

if os.environ.get("CI", "").strip().lower() != "true":
    pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from fedgp.cli import main as cli  # noqa: E402
from fedgp.errors import InputError  # noqa: E402
from fedgp.flower import app as flower_app  # noqa: E402
from fedgp.flower.local import LocalGrid  # noqa: E402
from fedgp.messages import config_json  # noqa: E402
from fedgp.strategies import FGPR  # noqa: E402

OWNERS = ["plant_A", "plant_B", "plant_C", "plant_D", "plant_E", "plant_F"]


def owner_tables(folder, nodes: int = 3, seed: int = 0) -> list:
    """Six owners of 3-feature data split over ``nodes`` CSV files (owner, x1..x3, y)."""
    rng = np.random.default_rng(seed)
    frames = []
    for i, owner in enumerate(OWNERS):
        X = rng.uniform(-1, 1, size=(30, 3))
        y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - 0.3 * X[:, 2] + 0.2 * i + 0.05 * rng.normal(size=30)
        frames.append(pd.DataFrame({"owner": owner, "x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "y": y}))
    paths = []
    for n, part in enumerate(np.array_split(np.arange(len(OWNERS)), nodes)):
        path = folder / f"node-{n}.csv"
        pd.concat([frames[i] for i in part]).to_csv(path, index=False)
        paths.append(path)
    return paths


def deploy(paths, run_config: dict, **node_config) -> LocalGrid:
    apps = {
        100 + n: (
            flower_app.clientapp,
            Context(
                run_id=0,
                node_id=100 + n,
                node_config={"data-path": str(p), "partition-id": n, **node_config},
                state=RecordDict(),
                run_config=run_config,
            ),  # fmt: skip
        )
        for n, p in enumerate(paths)
    }
    return LocalGrid(apps)


def test_the_app_fits_any_width_and_its_saved_model_predicts_as_in_process(tmp_path):
    paths = owner_tables(tmp_path)
    out = tmp_path / "model"
    config = {"rounds": 8, "stop": "none", "seed": 3, "out-dir": str(out), "eval-every": 0}
    grid = deploy(paths, config)
    flower_app._main(
        grid, Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "columns.json", "failures.csv", "history.csv", "model.fedgp", "progress.txt", "transforms.json"
    ]  # fmt: skip
    # model.fedgp last: a script that waits for it never reads a half-written folder
    written = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "progress.txt"}
    assert max(written.values()) == written["model.fedgp"]
    # what fedgp fit writes: the hyper-parameters in the data's units, each feature's lengthscale
    history = (out / "history.csv").read_text().splitlines()[0]
    assert "covar_module.base_kernel.lengthscale[x3]" in history
    columns = json.loads((out / "columns.json").read_text())
    assert columns["features"] == ["x1", "x2", "x3"] and columns["owners"] == OWNERS

    # The same run in process: the owners in node order, the same spec, strategy and options.
    from fedgp.data.table import read_owner_table

    clients = [c for p in paths for c in read_owner_table(p, group="owner", target="y").federation()]
    settings = flower_app.AppSettings(config)
    reference = fedgp.fit(settings.spec(3), fedgp.data.Federation(clients), settings.strategy(),
                          engine="sequential", **settings.fit_options())  # fmt: skip
    model = fedgp.load(out / "model.fedgp")
    lengthscale = model.state["covar_module.base_kernel.lengthscale"]
    assert lengthscale.shape[-1] == 3  # ARD from the data's width
    X = torch.rand(7, 3, dtype=torch.float64) * 2 - 1
    for client in clients[::2]:
        mean, var = model.predict(X, client, observation_noise=True)
        ref_mean, ref_var = reference.predict(X, client, observation_noise=True)
        torch.testing.assert_close(mean, ref_mean, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(var, ref_var, rtol=1e-8, atol=1e-10)

    # fedgp predict uses the deployment's folder as it uses fedgp fit's.
    new = tmp_path / "new.csv"
    pd.DataFrame(
        {"owner": ["plant_B", "plant_E"], "x1": [0.1, -0.2], "x2": [0.0, 0.3], "x3": [0.5, 0.5]}
    ).to_csv(new, index=False)
    pooled = tmp_path / "all.csv"
    pd.concat(pd.read_csv(p) for p in paths).to_csv(pooled, index=False)
    assert (
        cli(
            ["predict", str(out), str(new), "--data", str(pooled), "--out", str(tmp_path / "pred"), "--quiet"]
        )
        == 0
    )
    pred = pd.read_csv(tmp_path / "pred" / "predictions.csv")
    b = [c for c in clients if c.id == "plant_B"][0]
    expected, _ = reference.predict(torch.tensor([[0.1, 0.0, 0.5]], dtype=torch.float64), b)
    assert pred["mean"].iloc[0] == pytest.approx(float(expected[0]), rel=1e-8)


def test_the_app_reads_a_model_description_and_a_strategy_config(tmp_path):
    paths = owner_tables(tmp_path, nodes=2)
    spec = fedgp.presets.make_spec("matern52", "zero", d=3)
    from fedgp.models.spec_io import describe_spec

    desc = json.loads(json.dumps(describe_spec(spec)).replace('"ard_num_dims": 3', '"ard_num_dims": "auto"'))
    strategy = fedgp.strategies.IFCA(num_clusters=2, local_steps=2, batch_size=8)
    config = {
        "model": json.dumps(desc),
        "strategy-config": fedgp.messages.config_json(strategy),
        "rounds": 3,
        "stop": "none",
        "test-fraction": 0.2,
        "out-dir": str(tmp_path / "model"),
    }
    flower_app._main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    model = fedgp.load(tmp_path / "model" / "model.fedgp")
    assert type(model.strategy).__name__ == "IFCA"
    assert "MaternKernel" in json.dumps(model.spec.kernel.__class__.__name__ + str(model.spec.kernel))
    metrics = pd.read_csv(tmp_path / "model" / "metrics.csv")
    assert len(metrics) == len(OWNERS) and (metrics["n_test"] > 0).all()


def test_the_app_runs_with_client_level_privacy(tmp_path):
    paths = owner_tables(tmp_path, nodes=3)
    config = {"rounds": 3, "stop": "none", "out-dir": str(tmp_path / "model"),
              "privacy": json.dumps({"noise": 1.0, "delta": 1e-3, "rate": 0.5})}  # fmt: skip
    flower_app._main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    model = fedgp.load(tmp_path / "model" / "model.fedgp")
    assert type(model.strategy).__name__ == "DPFGPR" and model.strategy.rate == 0.5
    history = pd.read_csv(tmp_path / "model" / "history.csv")
    assert list(history["epsilon"]) == sorted(history["epsilon"]) and history["epsilon"].iloc[0] > 0
    rows = pd.read_csv(paths[0]).query("owner == @OWNERS[0]")
    own = fedgp.data.ClientData(rows[["x1", "x2", "x3"]].to_numpy(), rows["y"].to_numpy(), id=OWNERS[0])
    mean, var = model.predict(np.zeros((2, 3)), client=own)
    assert np.isfinite(np.asarray(mean)).all() and (np.asarray(var) > 0).all()


def test_a_node_answers_no_prediction_at_server_chosen_points_unless_its_config_allows(tmp_path):
    """A posterior at points the server picks gives a small owner's rows back; the app's nodes
    refuse ``predict`` tasks unless their node config says ``allow-predict=true``."""
    from fedgp.flower.grid_engine import GridEngine
    from fedgp.presets import make_spec

    paths = owner_tables(tmp_path, nodes=3)
    spec = make_spec(d=3)  # the app's defaults (fedgp.defaults), as its nodes build it
    X = torch.zeros(4, 3, dtype=torch.float64)
    for node_config, allowed in (
        ({}, False),
        ({"allow-predict": "false"}, False),
        ({"allow-predict": True}, True),
    ):
        grid = deploy(paths, {}, **node_config)
        result = fedgp.fit(
            spec, None, engine=GridEngine(grid, spec), rounds=1, callbacks=[fedgp.run.Progress(False)]
        )
        if allowed:
            mean, var = result.predict(X, client=0)
            assert mean.shape == (4,) and (var > 0).all()
        else:
            with pytest.raises(fedgp.errors.EngineError, match="could not predict.*allow-predict=true"):
                result.predict(X, client=0)
        # The owner's own test metrics and its state are still answered.
        assert len(result.client_state(0)) > 0


def test_the_app_releases_no_sum_of_one_owner_by_default(tmp_path):
    """``min-contributors`` (default 2): a federation of one owner gets no transforms' summary (its
    mean and sd would be that owner's own); 1 allows it."""
    path = owner_tables(tmp_path, nodes=1)[0]
    rows = pd.read_csv(path).query("owner == @OWNERS[0]")
    rows.to_csv(path, index=False)
    config = {"rounds": 1, "stop": "none", "out-dir": str(tmp_path / "model")}
    with pytest.raises(fedgp.errors.RoundFailedError, match="not released: 1 contributor"):
        flower_app._main(deploy([path], config), Context(0, 0, {}, RecordDict(), config))
    config["min-contributors"] = 1
    flower_app._main(deploy([path], config), Context(0, 0, {}, RecordDict(), config))
    assert (tmp_path / "model" / "model.fedgp").exists()


def test_the_app_aggregates_dp_updates_and_the_summary_securely(tmp_path):
    """``secure-aggregation``: the transforms' summary and DP-FGPR's clipped updates (summed fields,
    each carrying its client's share of the noise: distributed DP) reach the server only as the
    nodes' sum; the run ends where the same run without it ends."""
    paths = owner_tables(tmp_path, nodes=3)
    states = {}
    for name, secure in (("plain", ""), ("secure", "{}")):
        config = {"rounds": 3, "stop": "none", "out-dir": str(tmp_path / name), "secure-aggregation": secure,
                  "privacy": json.dumps({"noise": 1.0, "delta": 1e-3, "reproducible": True,
                                         "noise_at": "clients", "noise_shares": 4})}  # fmt: skip
        grid = deploy(paths, config)
        flower_app._main(grid, Context(0, 0, {}, RecordDict(), config))
        states[name] = fedgp.load(tmp_path / name / "model.fedgp").state
        if secure:
            assert grid.bytes_up > 0
    for key, value in states["plain"].items():
        torch.testing.assert_close(states["secure"][key], value, rtol=1e-7, atol=1e-9)
    history = pd.read_csv(tmp_path / "secure" / "history.csv")
    assert (history["failed"] == 0).all() and history["epsilon"].iloc[-1] > 0
    assert (history["noise_topup"] == 0).all()  # six owners' shares: the full noise, none from the server


def _grow(paths, rows: int = 6, seed: int = 9) -> None:
    """Each node's owners measure ``rows`` more points, appended to its file."""
    rng = np.random.default_rng(seed)
    for path in paths:
        table = pd.read_csv(path)
        more = []
        for owner in table["owner"].unique():
            X = rng.uniform(-1, 1, size=(rows, 3))
            y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - 0.3 * X[:, 2] + 0.05 * rng.normal(size=rows)
            more.append(pd.DataFrame({"owner": owner, "x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "y": y}))
        pd.concat([table, *more]).to_csv(path, index=False)


def test_the_app_continues_an_earlier_model_on_the_nodes_grown_rows(tmp_path):
    """Owners add rows on their nodes; ``warm-start`` continues the first run's model on every row:
    the same state as ``fedgp.fit(first.warm_spec(), grown, ...)`` in process, not a cold start's."""
    paths = owner_tables(tmp_path)
    first_out, second_out = tmp_path / "first", tmp_path / "second"
    config = {"rounds": 4, "stop": "none", "seed": 3, "out-dir": str(first_out)}
    flower_app._main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    _grow(paths)
    again = {**config, "out-dir": str(second_out), "warm-start": str(first_out)}
    flower_app._main(deploy(paths, again), Context(0, 0, {}, RecordDict(), again))
    continued = fedgp.load(second_out / "model.fedgp")
    assert continued.roster.sizes.tolist() == [36] * len(OWNERS)

    from fedgp.data.table import read_owner_table

    grown = [c for p in paths for c in read_owner_table(p, group="owner", target="y").federation()]
    first = fedgp.load(first_out / "model.fedgp")
    settings = flower_app.AppSettings(again)
    reference = fedgp.fit(first.warm_spec(), fedgp.data.Federation(grown), settings.strategy(),
                          engine="sequential", **settings.fit_options())  # fmt: skip
    for name, value in reference.state.items():
        torch.testing.assert_close(continued.state[name], value, rtol=1e-8, atol=1e-10)
    cold = fedgp.fit(settings.spec(3), fedgp.data.Federation(grown), settings.strategy(),
                     engine="sequential", **settings.fit_options())  # fmt: skip
    noise = "likelihood.noise_covar.noise"
    assert not torch.allclose(cold.state[noise], continued.state[noise])


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"kernel": "matern12"},
            "run config 'warm-start' continues the model's own kernel and mean; ['kernel']",
        ),
        ({"target": "x3"}, "run config 'warm-start': the model was fitted to target 'y'"),
        ({"warm-start": "nowhere"}, "run config 'warm-start': nowhere: no such folder"),
    ],
)
def test_a_warm_start_the_app_cannot_continue_is_one_line_naming_the_key(tmp_path, extra, message):
    paths = owner_tables(tmp_path, nodes=2)
    first = {"rounds": 2, "stop": "none", "out-dir": str(tmp_path / "first")}
    flower_app._main(deploy(paths, first), Context(0, 0, {}, RecordDict(), first))
    config = {
        "rounds": 2,
        "out-dir": str(tmp_path / "second"),
        "warm-start": str(tmp_path / "first"),
        **extra,
    }
    if extra.get("warm-start") == "nowhere":
        config["warm-start"] = "nowhere"
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        flower_app.main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    assert message.split(": ")[0] in (tmp_path / "second" / "error.txt").read_text()


@pytest.mark.parametrize(
    "config, message",
    [
        ({"rounds": "ten"}, "run config 'rounds' must be a int"),
        ({"colour": "red"}, "unknown run config keys ['colour']"),
        ({"stop": "soon"}, "'stop' and 'transforms' are 'auto' or 'none'"),
        ({"model": "{not json"}, "run config 'model' is not JSON"),
        ({"secure-aggregation": "[0.6]"}, "secure-aggregation settings must be a JSON object"),
        ({"secure-aggregation": '{"threshold": 0.3}'}, "SecureAggregation.threshold must be in [0.5, 1"),
        ({"clusters": 3}, "run config 'clusters' applies to strategy 'ifca', not to 'fgpr'"),
        (
            {"strategy-config": config_json(FGPR(personal=("noise",)))},
            "run config 'strategy-config': its owners keep personal hyper-parameters, which stay on their",
        ),
    ],
)
def test_bad_run_config_is_refused_naming_the_key(config, message):
    context = Context(0, 0, {}, RecordDict(), config)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings = flower_app.AppSettings.of(context)
        settings.strategy(), settings.fit_options(), settings.spec(2), settings.secure()


def test_a_node_with_a_bad_table_says_which_file_and_column(tmp_path):
    path = tmp_path / "bad.csv"
    pd.DataFrame({"owner": ["a", "a", "b"], "x1": [1.0, 2.0, 3.0], "target": [1.0, 2.0, 3.0]}).to_csv(
        path, index=False
    )
    config = {"out-dir": str(tmp_path / "m")}
    grid = deploy([path], config)
    with pytest.warns(fedgp.errors.FedGPWarning), pytest.raises(fedgp.errors.EngineError) as caught:
        flower_app._main(grid, Context(0, 0, {}, RecordDict(), config))
    assert "no Flower node registered" in str(caught.value)
    assert "TableError" in str(caught.value) and "bad.csv: no column" in str(caught.value)


def test_a_node_reads_parquet_as_it_reads_csv(tmp_path):
    paths = owner_tables(tmp_path, nodes=2)
    parquet = []
    for path in paths:
        parquet.append(path.with_suffix(".parquet"))
        pd.read_csv(path, dtype={"owner": str}).to_parquet(parquet[-1])
    loader = flower_app.TableLoader()
    for csv, pq in zip(paths, parquet):
        contexts = [Context(0, 1, {"data-path": str(p)}, RecordDict(), {}) for p in (csv, pq)]
        (_, a), (_, b) = loader(contexts[0]), loader(contexts[1])
        assert [c.id for c in a] == [c.id for c in b]
        for x, y in zip(a, b):
            assert torch.equal(x.X, y.X) and torch.equal(x.y, y.y)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(fedgp.errors.TableError, match="broken.parquet: cannot be read as a Parquet table"):
        loader(Context(0, 1, {"data-path": str(broken)}, RecordDict(), {}))
    dated = tmp_path / "dated.parquet"  # issue 51: a date column was read as microseconds since 1970
    frame = pd.read_csv(paths[0], dtype={"owner": str})
    frame.assign(x2=pd.Timestamp("2024-01-05") + pd.to_timedelta(np.arange(len(frame)), unit="D")).to_parquet(
        dated
    )
    with pytest.raises(fedgp.errors.TableError) as caught:
        loader(Context(0, 1, {"data-path": str(dated)}, RecordDict(), {}))
    assert str(caught.value).startswith(
        f"{dated}: column 'x2', line 2 (owner {frame['owner'][0]!r}): '2024-01-05 00:00:00' is a date and "
        "time, not a number; convert the column to numbers first"
    )
    assert "run config 'features'" in str(caught.value)


def test_simulated_nodes_share_one_table_by_partition_id(tmp_path):
    table = tmp_path / "all.csv"
    pd.concat(pd.read_csv(p) for p in owner_tables(tmp_path)).to_csv(table, index=False)
    config = {"simulation-data": str(table)}
    loader = flower_app.TableLoader()
    hosted = [
        [
            c.id
            for c in loader(Context(0, n, {"partition-id": n, "num-partitions": 4}, RecordDict(), config))[1]
        ]
        for n in range(4)
    ]
    assert hosted == [OWNERS[0:2], OWNERS[2:4], OWNERS[4:5], OWNERS[5:6]]
    with pytest.raises(InputError, match="has no 'data-path'"):
        loader(Context(0, 1, {}, RecordDict(), {}))


def test_fedgp_flower_new_writes_the_example_app(tmp_path, capsys):
    from fedgp.flower.template import app_pyproject

    assert cli(["flower", "new", str(tmp_path / "app")]) == 0
    text = (tmp_path / "app" / "pyproject.toml").read_text()
    assert 'serverapp = "fedgp.flower.app:serverapp"' in text and 'name = "app"' in text
    import tomllib

    config = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]
    assert config == flower_app.RUN_CONFIG  # every key, with its default
    assert cli(["flower", "new", str(tmp_path / "app")]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err
    example = flower_app.Path(__file__).resolve().parents[2] / "examples" / "flower" / "pyproject.toml"
    assert example.read_text() == app_pyproject("fedgp-flower-example"), "regenerate examples/flower"


def test_a_node_reads_a_folder_of_npz_clients(tmp_path):
    from fedgp.flower import save_npz_clients

    draws = fedgp.synthetic.gp_federation(num_clients=3, n=10, d=2, n_test=3, seed=1)
    save_npz_clients(tmp_path / "owners", list(draws.federation))
    loader = flower_app.TableLoader()
    context = Context(0, 1, {"data-path": str(tmp_path / "owners")}, RecordDict(), {"ard": False})
    spec, clients = loader(context)
    assert [c.id for c in clients] == list(draws.federation.ids) and loader.columns(context) == ["x0", "x1"]
    assert all(torch.equal(a.y_test, b.y_test) for a, b in zip(clients, draws.federation))
    assert spec.kernel.base_kernel.ard_num_dims is None


# -- issue 49: privacy where the guide runs it, and a deployment that fails loudly -----------------


def one_owner_per_node(folder, nodes: int = 3) -> list:
    """The deployment guide's shape: ``nodes`` nodes, one owner each."""
    paths = owner_tables(folder, nodes=nodes)
    for path in paths:
        table = pd.read_csv(path, dtype={"owner": str})
        table[table["owner"] == table["owner"].iloc[0]].to_csv(path, index=False)
    return paths


def test_dp_sampling_with_secure_aggregation_skips_the_rounds_that_drew_one_node(tmp_path):
    """The guide's recipe (``privacy='{"epsilon": 4, "rate": 0.5}' secure-aggregation='{}'`` on 3
    nodes of one owner each): Poisson sampling often draws one node, secure aggregation releases no
    sum of one, and the RoundFailedError ended the run. Now such a round is skipped (the state kept,
    ``skipped`` in the history, the reason in failures.csv), accounted (ε grows every round, as the
    unamplified Gaussian mechanism: a round that may be skipped hides no sampling), and the run
    finishes. The same run on the sequential engine samples the same owners every round, skips
    none (it needs no secure aggregation) and keeps the amplification."""
    from fedgp.run.privacy import epsilon_spent

    paths = one_owner_per_node(tmp_path)
    out = tmp_path / "model"
    privacy = {"epsilon": 4, "rate": 0.5}
    config = {"rounds": 8, "stop": "none", "seed": 1, "out-dir": str(out), "secure-aggregation": "{}",
              "privacy": json.dumps(privacy)}  # fmt: skip
    flower_app.main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    model = fedgp.load(out / "model.fedgp")
    history = pd.read_csv(out / "history.csv")
    assert len(history) == 8 and not (out / "error.txt").exists()
    skipped = history["skipped"].astype(bool)
    assert skipped.any() and (~skipped).any(), history[["participants", "skipped"]]
    assert (skipped == (history["participants"] == 1)).all()  # one node drawn: no sum of one released
    state = [c for c in history.columns if c.startswith(("covar_module", "mean_module", "likelihood"))]
    assert state
    for i in np.flatnonzero(skipped.to_numpy()):
        if i:
            pd.testing.assert_series_equal(
                history[state].iloc[i], history[state].iloc[i - 1], check_names=False
            )
    failures = pd.read_csv(out / "failures.csv")
    assert sorted(set(failures["round"])) == list(history["round"][skipped])
    assert failures["reason"].str.contains("secure aggregation: 1 node").all()
    noise, delta = float(model.strategy.noise), 1e-5
    expected = [epsilon_spent(noise, 1.0, t, delta) for t in range(1, 9)]
    np.testing.assert_allclose(history["epsilon"], expected, rtol=1e-12)
    assert expected[-1] <= privacy["epsilon"]
    assert model.history.attrs.get("privacy", {}).get("accounted_rate", 1.0) == 1.0

    # The sequential engine: the same sampled owners, no skip, amplification by sampling kept.
    from fedgp.data.table import read_owner_table

    clients = [c for p in paths for c in read_owner_table(p, group="owner", target="y").federation()]
    settings = flower_app.AppSettings(config)
    reference = fedgp.fit(settings.spec(3), fedgp.data.Federation(clients), settings.privacy(),
                          engine="sequential", **settings.fit_options())  # fmt: skip
    ref = reference.history
    assert list(ref["participants"]) == list(history["participants"])
    assert not ref["skipped"].any() and reference.history.attrs["privacy"]["accounted_rate"] == 0.5
    ref_noise = float(reference.strategy.noise)
    np.testing.assert_allclose(ref["epsilon"], [epsilon_spent(ref_noise, 0.5, t, delta) for t in range(1, 9)])
    assert ref_noise < noise  # amplification buys less noise for the same ε where no round may be skipped


def test_a_failed_serverapp_leaves_one_line_in_out_dir_and_a_later_run_clears_it(tmp_path, capsys):
    """The guide's ``flwr run`` with a table whose owner column is not ``owner`` failed in the
    ServerApp, visible only in ``flwr log``, while ``flwr run`` exits 0: now ``error.txt`` in
    ``out-dir`` says why on one line, naming the run-config key, and ``fedgp flower status`` reads it."""
    paths = owner_tables(tmp_path, nodes=2)
    for path in paths:
        pd.read_csv(path).rename(columns={"owner": "plant"}).to_csv(path, index=False)
    out = tmp_path / "model"
    config = {"rounds": 2, "stop": "none", "out-dir": str(out)}
    with pytest.warns(fedgp.errors.FedGPWarning), pytest.raises(fedgp.errors.EngineError):
        flower_app.main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    error = (out / "error.txt").read_text()
    assert error.count("\n") == 1 and "Traceback" not in error
    assert error.startswith(f"EngineError: no Flower node registered: node 100: TableError: {paths[0]}: ")
    assert f"; node 101: TableError: {paths[1]}: " in error
    assert "no column 'owner' (run config 'group'); its columns are 'plant', 'x1', 'x2', 'x3', 'y'" in error
    assert cli(["flower", "status", str(out)]) == 1
    assert capsys.readouterr().out == f"failed: {error}"

    config["group"] = "plant"  # the same out-dir, the owner column named: the old reason goes
    flower_app.main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
    assert not (out / "error.txt").exists() and (out / "progress.txt").read_text() == "2\n"
    assert cli(["flower", "status", str(out)]) == 0
    assert capsys.readouterr().out.startswith("finished: 2 round(s), model.fedgp written ")

    config["colour"] = "red"  # a bad run config fails before any message goes out
    grid = deploy(paths, config)
    with pytest.raises(InputError):
        flower_app.main(grid, Context(0, 0, {}, RecordDict(), config))
    assert grid.bytes_down == 0
    assert (out / "error.txt").read_text().startswith("InputError: unknown run config keys ['colour']")


def test_status_says_running_from_progress_and_refuses_a_folder_without_a_run(tmp_path, capsys):
    from fedgp.layout import run_state, write_progress

    assert cli(["flower", "status", str(tmp_path)]) == 2
    assert "no progress.txt, model.fedgp or error.txt" in capsys.readouterr().err
    write_progress(tmp_path, 3)
    assert run_state(tmp_path)[0] == "running"
    assert cli(["flower", "status", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("running: 3 round(s) completed, the last update ")


def test_the_flower_app_without_dp_accounting_says_which_extra_before_any_message(tmp_path, monkeypatch):
    """It failed with ``ModuleNotFoundError: dp_accounting`` mid-run, and Flower then advised editing the
    app's pyproject.toml (its answer to an ImportError): now the ServerApp stops before the hello,
    with fedgp's one line, raised as an EngineError."""
    import sys

    for name in [m for m in sys.modules if m == "dp_accounting" or m.startswith("dp_accounting.")]:
        monkeypatch.setitem(sys.modules, name, None)
    paths = owner_tables(tmp_path, nodes=2)
    out = tmp_path / "model"
    config = {"rounds": 2, "out-dir": str(out), "privacy": json.dumps({"epsilon": 4, "rate": 0.5})}
    grid = deploy(paths, config)
    with pytest.raises(fedgp.errors.EngineError) as caught:
        flower_app.main(grid, Context(0, 0, {}, RecordDict(), config))
    assert not isinstance(caught.value, ImportError) and grid.bytes_down == 0
    assert (out / "error.txt").read_text() == (
        "MissingExtraError: ClientDP needs 'dp_accounting' (the 'privacy' extra): "
        'pip install "fedgp-gpytorch[privacy]"\n'
    )


def test_a_node_without_pyarrow_names_the_parquet_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    path = tmp_path / "owners.parquet"
    path.write_bytes(b"PAR1")
    out = tmp_path / "model"
    config = {"out-dir": str(out)}
    with pytest.warns(fedgp.errors.FedGPWarning), pytest.raises(fedgp.errors.EngineError):
        flower_app.main(deploy([path], config), Context(0, 0, {}, RecordDict(), config))
    assert (out / "error.txt").read_text() == (
        f"EngineError: no Flower node registered: node 100: MissingExtraError: {path}: reading Parquet needs "
        "'pyarrow' (the 'parquet' extra): pip install \"fedgp-gpytorch[parquet]\"\n"
    )


def test_a_flower_log_line_prints_once_after_dp_accounting_ran():
    """absl's logging calls ``logging.basicConfig()`` on a root logger without handlers, before it
    checks a record's level: after fedgp's first call into dp-accounting every Flower log line (Flower's
    logger has its own handler and propagates) printed twice."""
    import subprocess
    import sys

    code = (
        "import logging\n"
        "from flwr.common.logger import log\n"
        "from fedgp.run.privacy import calibrate_noise, epsilon_spent\n"
        "calibrate_noise(4.0, 1e-5, 0.5, 20)\n"
        "epsilon_spent(1.0, 0.5, 3, 1e-5)\n"
        "log(logging.INFO, 'fedgp-marker-line')\n"
        "print(len(logging.root.handlers))\n"
    )
    repo = flower_app.Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "FLWR_TELEMETRY_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("fedgp-marker-line") == 1, done.stderr[-2000:]
    assert done.stdout.strip() == "0"  # the root logger as it was: no handler left behind


def test_a_budget_that_affords_no_round_is_refused_before_any_message(tmp_path):
    """Issue 51, item 4 through the Flower door: ``privacy={"epsilon": 0.5, "noise": 0.3}`` over 10
    rounds is refused with no message sent (not even the hello), naming the noise that fits."""
    paths = owner_tables(tmp_path, nodes=2)
    out = tmp_path / "model"
    privacy = {"epsilon": 0.5, "noise": 0.3, "delta": 1e-3}
    config = {"rounds": 10, "out-dir": str(out), "privacy": json.dumps(privacy)}
    grid = deploy(paths, config)
    with pytest.raises(InputError, match=r"affords 0 of the 10 rounds at noise 0.3"):
        flower_app.main(grid, Context(0, 0, {}, RecordDict(), config))
    assert grid.bytes_down == 0
    error = (out / "error.txt").read_text()
    assert error.count("\n") == 1 and "smallest noise multiplier that fits one round is noise=" in error
    assert not (out / "model.fedgp").exists()
