"""Every path of fedgp's doors (Python, scikit-learn, the CLI, the saved file, the Flower app) that could
give a default where an answer was asked for, each exercised once, and how to judge what it did.

Used by ``tests/test_silent_defaults.py`` (every path must raise, warn or answer; a path the user chose
explicitly must stay quiet) and by the study ``benchmarks/silent_defaults.py``, which tabulates the
outcomes, also against an older checkout (``--against``): the cases use only what fedgp had at 0656142,
so the same code measures both. The outcomes:

- ``raises``: refused, with a message (what and where);
- ``warns``: a fedgp warning, a scikit-learn feature-name warning, a ``warning:`` line of the CLI or a
  WARNING line of the Flower app's log says what happened;
- ``answers``: quiet, and the answer is the right one (e.g. columns matched by name);
- ``chosen, quiet``: a default the user chose explicitly (``unknown_groups="prior"``, ``--unknown
  prior``, an empty ``ClientData``), given without a warning;
- ``silent default``: quiet, and what came back is a default or another answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import fedgp
from fedgp.data import ClientData, Federation

__all__ = ["PATHS", "Env", "observe"]

QUIET = [fedgp.run.Progress(False)]


def _table(n=60, seed=0) -> pd.DataFrame:
    """Owners p, q, r; features a, b, c on different scales (a swap changes every prediction)."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"a": rng.uniform(0, 1, n), "b": rng.uniform(0, 10, n), "c": rng.uniform(-50, 50, n)})
    y = np.sin(6 * X["a"]) + 0.1 * X["b"] + 0.01 * X["c"] + 0.05 * rng.normal(size=n)
    return X.assign(owner=np.repeat(["p", "q", "r"], n // 3), y=y)


class Refused(Exception):
    """A command that exited with status 2, with what it printed."""


class Env:
    """The fitted models the paths use, built once each (warnings of the fits themselves kept out)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.table = _table()
        self.X = self.table[["a", "b", "c"]]

    building = False  # while a model is built, what its fit says is not the path's (observe skips it)

    def _quietly(self, build: Callable):
        self.building = True
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                return build()
        finally:
            self.building = False

    @functools.cached_property
    def federation(self) -> Federation:
        parts = [np.flatnonzero(self.table.owner == o) for o in "pqr"]
        return Federation.from_partition(self.X, self.table.y.to_numpy(), parts, ids=list("pqr"))

    @functools.cached_property
    def result(self):
        fit = functools.partial(fedgp.fit, fedgp.GPSpec(), self.federation, rounds=3, stop="auto")
        return self._quietly(lambda: fit(callbacks=QUIET))

    @functools.cached_property
    def private(self):
        dp = fedgp.run.ClientDP(fedgp.strategies.FGPR(), noise=1.0, clip=1.0, rate=1.0, delta=1e-3)
        return self._quietly(
            lambda: fedgp.fit(fedgp.GPSpec(), self.federation, dp, rounds=2, callbacks=QUIET)
        )

    def loaded(self, result=None):
        return fedgp.load((result or self.result).save(self.folder / "saved.fedgp"))

    def client(self, columns, rows=slice(0, 20), cid="new") -> ClientData:
        return ClientData(self.X[columns].iloc[rows], self.table.y.iloc[rows], id=cid)

    def estimator(self, named: bool, **params):
        from fedgp.sklearn import FederatedGPRegressor

        X = self.X if named else self.X.to_numpy()
        est = FederatedGPRegressor(rounds=3, **params)
        return self._quietly(lambda: est.fit(X, self.table.y.to_numpy(), groups=self.table.owner.to_numpy()))

    @functools.cached_property
    def cli_folder(self) -> Path:
        from fedgp.cli import main

        self.table.to_csv(self.folder / "data.csv", index=False)
        out = self.folder / "cli-model"
        argv = ["fit", str(self.folder / "data.csv"), "--target", "y", "--group", "owner", "--rounds", "3"]
        assert self._quietly(lambda: main([*argv, "--quiet", "--out", str(out)])) == 0
        return out

    def cli_predict(self, new: pd.DataFrame, *extra, folder=None) -> pd.DataFrame:
        from fedgp.cli import main

        folder = folder or self.cli_folder
        new.to_csv(self.folder / "new.csv", index=False)
        out = self.folder / "cli-predictions"
        argv = ["predict", str(folder), str(self.folder / "new.csv"), "--quiet", "--force", "--out", str(out)]
        if main([*argv, *extra]) != 0:
            raise Refused("exit status 2")
        return pd.read_csv(out / "predictions.csv")

    def flower(self, orders=None, **config) -> Path:
        """The Flower app's output folder for the table over 3 nodes (``orders``: each node's columns)."""
        from flwr.app import Context, RecordDict

        from fedgp.flower import app as flower_app
        from tests.flower.test_flower_app import deploy

        out = self.folder / f"flower-{len(list(self.folder.glob('flower-*')))}"
        paths = []
        for n, owner in enumerate("pqr"):
            columns = (orders or [["owner", "a", "b", "c", "y"]] * 3)[n]
            paths.append(self.folder / f"{out.name}-node-{n}.csv")
            self.table[self.table.owner == owner][columns].to_csv(paths[-1], index=False)
        config = {"rounds": 3, "stop": "auto", "out-dir": str(out), "eval-every": 0, **config}
        flower_app._main(deploy(paths, config), Context(0, 0, {}, RecordDict(), config))
        return out

    @functools.cached_property
    def flower_folder(self) -> Path:
        return self._quietly(self.flower)


def _same(a, b) -> bool:
    return bool(torch.equal(torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))))


def _prior_of(result, X) -> torch.Tensor:
    return result.predict(np.asarray(X), ClientData(np.empty((0, 3)), np.empty(0), id="nobody"))[0]


# Each path's run: True when the right answer came back, False when a default (or another answer) did.
# A path with no right answer to give (a column the model never saw, say) returns False: quiet there is
# a silent default; raising or warning is what it should do.
def _reordered(env, loaded=False) -> bool:
    model = env.loaded() if loaded else env.result
    client = env.client(["a", "b", "c"], cid="p") if loaded else "p"
    want = model.predict(env.X.iloc[:5], client=client)[0]
    return _same(model.predict(env.X[["b", "c", "a"]].iloc[:5], client=client)[0], want)


def _renamed(env) -> bool:
    env.result.predict(env.X.rename(columns={"c": "z"}).iloc[:3], client="p")
    return False


def _combined(env) -> bool:
    want = env.result.predict(env.X.iloc[:4], combine="gpoe")[0]
    return _same(env.result.predict(env.X[["c", "a", "b"]].iloc[:4], combine="gpoe")[0], want)


def _new_client(env) -> bool:
    X = env.X.iloc[40:43]
    return _same(env.result.predict(X, client=env.client(["c", "b", "a"]))[0],
                 env.result.predict(X, client=env.client(["a", "b", "c"]))[0])  # fmt: skip


def _test_split(env) -> bool:
    y = env.table.y
    client = ClientData(
        env.X.iloc[:9], y.iloc[:9], X_test=env.X[["c", "a", "b"]].iloc[9:12], y_test=y.iloc[9:12]
    )
    return _same(client.X_test, env.X.iloc[9:12].to_numpy())


def _mixed_clients(env) -> bool:
    Federation([env.client(["a", "b", "c"], cid=1), env.client(["b", "a", "c"], cid=2)])
    return False


def _unknown_id(env) -> bool:
    env.result.predict(env.X.iloc[:2], client="P")
    return False


def _empty_evaluation(env) -> bool:
    return len(env.result.evaluate()) > 0


def _empty_client(env) -> bool:
    X = env.X.iloc[:2].to_numpy()
    return _same(
        env.result.predict(X, client=ClientData(np.empty((0, 3)), np.empty(0)))[0], _prior_of(env.result, X)
    )


def _export(env) -> bool:
    return _same(
        env.result.to_gpytorch(env.client(["b", "a", "c"])).train_inputs[0], env.client(["a", "b", "c"]).X
    )


def _unknown_owner(env, **params) -> bool:
    est = env.estimator(False, **params)
    X = env.X.to_numpy()[:3]
    prior = _same(est.predict(X, groups=["P", "P", "P"]), _prior_of(est.result_, X))
    return prior and bool(params)  # the prior is the answer only where it was asked for


def _sklearn_reordered(env) -> bool:
    est = env.estimator(True)
    return _same(
        est.predict(env.X[["c", "a", "b"]].iloc[:4], groups=["p"] * 4),
        est.predict(env.X.iloc[:4], groups=["p"] * 4),
    )


def _sklearn_extra(env) -> bool:
    env.estimator(True).predict(env.X.assign(d=1.0).iloc[:2], groups=["p"] * 2)
    return False


def _sklearn_names_unfitted(env) -> bool:
    env.estimator(False).predict(env.X[["c", "b", "a"]].iloc[:2], groups=["p"] * 2)
    return False  # fit saw no names: nothing to match these columns to, so they are read by position


def _sklearn_no_groups(env) -> bool:
    from fedgp.sklearn import FederatedGPRegressor

    FederatedGPRegressor(rounds=1).fit(env.X.to_numpy(), env.table.y.to_numpy())
    return False  # one owner stands in for the federation the rows may have come from


def _new_rows(env) -> pd.DataFrame:
    return env.table.iloc[::9].drop(columns="y")


def _cli_reordered(env) -> bool:
    data = str(env.folder / "data.csv")
    want = env.cli_predict(_new_rows(env), "--data", data)["mean"]
    return _same(env.cli_predict(_new_rows(env)[["c", "owner", "b", "a"]], "--data", data)["mean"], want)


def _cli_extra(env) -> bool:
    env.cli_predict(_new_rows(env).assign(d=1.0), "--data", str(env.folder / "data.csv"))
    return False  # a column the model does not read


def _cli_disagreeing_folder(env) -> bool:
    import shutil

    folder = env.folder / "mixed-folder"
    shutil.copytree(env.cli_folder, folder, dirs_exist_ok=True)
    columns = json.loads((folder / "columns.json").read_text())
    (folder / "columns.json").write_text(json.dumps({**columns, "features": ["b", "a", "c"]}))
    data = str(env.folder / "data.csv")
    want = env.cli_predict(_new_rows(env), "--data", data)["mean"]
    return _same(env.cli_predict(_new_rows(env), "--data", data, folder=folder)["mean"], want)


def _cli_owner_without_rows(env, *extra) -> bool:
    new = env.table.iloc[:2].drop(columns="y").assign(owner="s")
    mean = env.cli_predict(new, "--data", str(env.folder / "data.csv"), *extra)["mean"]
    prior = _prior_of(fedgp.load(env.cli_folder / "model.fedgp"), new[["a", "b", "c"]])
    return bool(np.allclose(mean, prior.numpy(), rtol=1e-12, atol=0)) and bool(extra)  # asked for: an answer


def _cli_stop_reason(env) -> bool:
    return "stop_reason" in fedgp.load(env.cli_folder / "model.fedgp").history.attrs


def _attrs_kept(env, key, result=None) -> bool:
    result = result or env.result
    return env.loaded(result).history.attrs.get(key) == result.history.attrs[key]


def _tuple_attr(env) -> bool:
    result = env.result
    history = result.history.copy()
    history.attrs = {**result.history.attrs, "pair": (1, 2)}
    loaded = env.loaded(dataclasses.replace(result, history=history))
    return loaded.history.attrs.get("pair") == (1, 2)


def _v3(env) -> bool:
    """A file of format version 3 (what 0656142 wrote) loaded: it cannot hold the names or the stop
    reason, so a default stands in for them."""
    from fedgp.messages.container import pack, seal, unpack, unseal
    from fedgp.run import saved

    path = env.result.save(env.folder / "v4.fedgp")
    header, tensors = unpack(unseal(path.read_bytes(), str(path)), "fit-result", saved.VERSION, str(path))
    for key in ("format", "version", "feature_names", "history_attrs"):
        header.pop(key, None)
    for frame in ("history", "failures"):
        header[frame].pop("dtypes", None), header[frame].pop("range", None)
    (env.folder / "v3.fedgp").write_bytes(seal(pack("fit-result", 3, header, tensors)))
    fedgp.load(env.folder / "v3.fedgp")
    return False


def _flower_reordered(env) -> bool:
    model = fedgp.load(env.flower_folder / "model.fedgp")
    client = env.client(["a", "b", "c"], cid="p")
    want = model.predict(env.X.iloc[:4], client=client)[0]
    return _same(model.predict(env.X[["b", "c", "a"]].iloc[:4], client=client)[0], want)


def _flower_stop_reason(env) -> bool:
    return "stop_reason" in fedgp.load(env.flower_folder / "model.fedgp").history.attrs


def _flower_column_orders(env) -> bool:
    orders = [["owner", "a", "b", "c", "y"], ["owner", "b", "a", "c", "y"], ["owner", "a", "b", "c", "y"]]
    env.flower(orders, rounds=1, stop="none")
    return False  # nodes whose columns differ in order, fitted as one model by position


def _flower_no_test_split(env) -> bool:
    env.flower(rounds=1, stop="none")
    return False  # the folder has no metrics.csv


@dataclass(frozen=True)
class SilentPath:
    """One path: its door, what it is, what the user does, and how to run it. ``chosen``: the user
    asked for the default explicitly, so it must come quietly."""

    door: str
    path: str
    trigger: str
    run: Callable[[Env], bool]
    chosen: bool = False


P = SilentPath
# fmt: off
PATHS: list[SilentPath] = [
    P("python", "reordered columns", "result.predict(X_df[['b','c','a']], client='p')", _reordered),
    P("python", "renamed column", "result.predict(X_df with c renamed z, client='p')", _renamed),
    P("python", "combined, reordered columns", "result.predict(X_df[['c','a','b']], combine='gpoe')",
      _combined),
    P("python", "new client, reordered columns", "predict for ClientData(X_df[['c','b','a']], y)",
      _new_client),
    P("python", "test split, reordered columns", "ClientData(X_df, y, X_test=X_df[['c','a','b']], ...)",
      _test_split),
    P("python", "clients' columns in other orders",
      "Federation of ClientData(X_df), ClientData(X_df[['b','a','c']])", _mixed_clients),
    P("python", "unknown client id", "result.predict(X, client='P') after training on 'p'", _unknown_id),
    P("python", "empty evaluation", "result.evaluate() on a federation without a test split",
      _empty_evaluation),
    P("python", "client without rows (prior chosen)", "predict for ClientData(empty X, empty y)",
      _empty_client, chosen=True),
    P("python", "export, reordered columns", "result.to_gpytorch(ClientData(X_df[['b','a','c']], y))",
      _export),
    P("sklearn", "unknown owner", "est.predict(X, groups=['P', ...]) where fit saw 'p'", _unknown_owner),
    P("sklearn", "unknown owner (prior chosen)",
      "FederatedGPRegressor(unknown_groups='prior'), groups=['P', ...]",
      functools.partial(_unknown_owner, unknown_groups="prior"), chosen=True),
    P("sklearn", "reordered columns", "est.predict(X_df[['c','a','b']], ...) after fit(X_df, ...)",
      _sklearn_reordered),
    P("sklearn", "extra column", "est.predict(X_df.assign(d=1), ...)", _sklearn_extra),
    P("sklearn", "names where fit had none", "est.predict(X_df, ...) after fit(X_df.to_numpy(), ...)",
      _sklearn_names_unfitted),
    P("sklearn", "no groups at fit", "est.fit(X, y): one owner, a centralised GP", _sklearn_no_groups),
    P("cli", "reordered columns", "fedgp predict MODEL new.csv (columns c, owner, b, a)", _cli_reordered),
    P("cli", "extra column", "fedgp predict MODEL new.csv with a column d the model does not read",
      _cli_extra),
    P("cli", "folder's files disagree", "columns.json lists b, a, c; model.fedgp was trained on a, b, c",
      _cli_disagreeing_folder),
    P("cli", "owner without rows", "fedgp predict MODEL new.csv (owner 's', no rows in --data)",
      _cli_owner_without_rows),
    P("cli", "owner without rows (prior chosen)", "fedgp predict ... --unknown prior",
      lambda env: _cli_owner_without_rows(env, "--unknown", "prior"), chosen=True),
    P("cli", "stop reason of the model", "fedgp.load(MODEL/model.fedgp).history.attrs['stop_reason']",
      _cli_stop_reason),
    P("saved file", "stop reason", "fedgp.load(r.save(p)).history.attrs['stop_reason']",
      functools.partial(_attrs_kept, key="stop_reason")),
    P("saved file", "privacy accounting", "fedgp.load(r.save(p)).history.attrs['privacy'] (ClientDP)",
      lambda env: _attrs_kept(env, "privacy", env.private)),
    P("saved file", "reordered columns", "fedgp.load(r.save(p)).predict(X_df[['b','c','a']], ClientData)",
      functools.partial(_reordered, loaded=True)),
    P("saved file", "an attr JSON would change", "history.attrs['pair'] = (1, 2); r.save(p)", _tuple_attr),
    P("saved file", "a file of format version 3", "fedgp.load(a file as 0656142 saved it)", _v3),
    P("flower", "reordered columns", "fedgp.load(out-dir/model.fedgp).predict(X_df[['b','c','a']], ...)",
      _flower_reordered),
    P("flower", "stop reason", "fedgp.load(out-dir/model.fedgp).history.attrs['stop_reason']",
      _flower_stop_reason),
    P("flower", "nodes' columns in other orders", "three nodes' CSV files, one with columns b, a, c",
      _flower_column_orders),
    P("flower", "no test split", "run config test-fraction 0 (the default): no metrics.csv",
      _flower_no_test_split),
]
# fmt: on


def _speaks(warning) -> bool:
    """A warning about the path: fedgp's own (but a fit's verdict on its convergence, which speaks of
    the training, not of the path), or scikit-learn's about feature names."""
    from fedgp.errors import ConvergenceWarning, FedGPWarning

    if issubclass(warning.category, ConvergenceWarning):
        return False
    return issubclass(warning.category, FedGPWarning) or "feature names" in str(warning.message)


def observe(path: SilentPath, env: Env) -> tuple[str, str]:
    """Run ``path`` once: ``(outcome, what was said)``, the outcome one of the module docstring's."""
    err, records = io.StringIO(), []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: None if env.building else records.append(record)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            with contextlib.redirect_stdout(io.StringIO()):
                right = path.run(env)
    except (ValueError, KeyError, TypeError, RuntimeError, Refused) as error:
        said = err.getvalue().strip().splitlines()[-1:] if isinstance(error, Refused) else [str(error)]
        return "raises", f"{type(error).__name__}: {said[0] if said else ''}"
    finally:
        logger.removeHandler(handler)
    said = [str(w.message) for w in caught if _speaks(w)]
    said += [line for line in err.getvalue().splitlines() if "warning:" in line]
    said += [r.getMessage() for r in records if "fedgp" in r.getMessage()]
    if said:
        return "warns", said[0]
    if right:
        return ("chosen, quiet" if path.chosen else "answers"), ""
    return "silent default", ""


def run_all(paths=PATHS) -> pd.DataFrame:
    """Every path's outcome, one row each: door, path, trigger, outcome, said."""
    with tempfile.TemporaryDirectory() as folder:
        env = Env(Path(folder))
        rows = []
        for path in paths:
            outcome, said = observe(path, env)
            said = " ".join(said.replace(folder, "<tmp>").split())  # no run's own temporary paths
            said = said[:160] + ("..." if len(said) > 160 else "")
            rows.append({"door": path.door, "path": path.path, "trigger": path.trigger, "chosen": path.chosen,
                         "outcome": outcome, "said": said})  # fmt: skip
    return pd.DataFrame(rows)
