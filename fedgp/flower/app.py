"""fedgp's own Flower app, for any data: a ``ServerApp`` and a ``ClientApp`` configured entirely by
Flower's run config and node config, so another data set needs no code.

``fedgp flower new DIR`` writes an app folder whose ``pyproject.toml`` names these two objects and
lists every run-config key with its default (:data:`RUN_CONFIG`). What each side reads:

* **a SuperNode** (``--node-config``): ``data-path``, its owners' rows — a CSV file (or Parquet, with
  pyarrow) with an owner column, read and checked exactly as ``fedgp fit DATA.csv`` reads its table,
  or a folder of ``*.npz`` files (:func:`~fedgp.flower.client.save_npz_clients`); optionally
  ``capture-dir`` (every message in and out kept there, :func:`~fedgp.flower.capture.capture_mod`)
  and ``allow-predict=true`` (answer predictions at points the server chooses; off by default,
  since a posterior at chosen points gives a small owner's rows back), and under secure
  aggregation ``secagg-min-threshold``, ``secagg-min-peers``, ``secagg-identity-key`` and
  ``secagg-roster`` (what the node accepts whatever the server announces:
  :class:`~fedgp.flower.secagg.NodePolicy`).
  The node builds the model from the run config and the width of its own data.
* **the run** (``--run-config``): the columns (``target``, ``group``, ``features``), the model
  (``kernel``/``mean``/``ard`` by name, or ``model``: a spec description as JSON, the format a saved
  model uses, with ``"ard_num_dims": "auto"`` for the data's width), the strategy (``strategy`` by
  name with ``local-steps``/``batch-size``/``lr``/``clusters``, or ``strategy-config``: a strategy's
  JSON config), ``rounds``, ``stop``, ``transforms``, ``hide-discrete``, ``seed``, ``test-fraction``,
  ``timeout``, ``eval-every``, ``out-dir``, ``min-contributors`` (default 2: no sum of one owner's values is
  released), ``privacy`` (client-level DP, :class:`fedgp.run.ClientDP` as JSON) and
  ``secure-aggregation`` (:class:`fedgp.flower.SecureAggregation` as JSON, ``{}`` for its defaults:
  the server learns summed fields only as the sum over the nodes of a round).

The ServerApp first checks every run-config setting, asks the nodes for their data's width and
columns (a ``hello``), builds the model, runs ``fedgp.fit`` over the grid and writes into ``out-dir``
what ``fedgp fit`` writes: ``model.fedgp`` (:meth:`FitResult.save`), ``columns.json``,
``history.csv`` and ``transforms.json`` (:func:`fedgp.layout.write_history`), ``failures.csv`` and
``metrics.csv`` (owners with a test split) — so ``fedgp.load``, ``fedgp predict OUT NEW.csv --data
...``, ``to_gpytorch`` and ``to_botorch`` use a deployment's model as they use a local one. Each
round logs one INFO line through Flower's logger (``flwr log <run-id>`` shows it).

``flwr run`` returns as soon as the run is submitted, with exit status 0 whatever the ServerApp
then does, so the run's state is kept in ``out-dir`` too (``fedgp flower status OUT_DIR`` reads it):

* ``progress.txt`` — the number of rounds completed: ``0`` once the run has started (any
  ``error.txt`` of an earlier run is removed then), rewritten after every round;
* ``model.fedgp`` — written last: the run has finished and the folder is complete;
* ``error.txt`` — the run failed: why, on one line (a bad setting or table names the run-config
  key, file and column; a missing extra names its ``pip install``), also logged as one ERROR line.

Under ``privacy`` and ``secure-aggregation``, a round whose sum secure aggregation withholds (the
sampling drew one node, or nodes were lost mid-round) is skipped, never the end of the run: the state
kept, its ε accounted, ``skipped`` in ``history.csv`` and the reason in ``failures.csv``. With
sampling (``rate`` below 1) ε is then accounted without amplification by sampling
(:meth:`fedgp.run.ClientDP.accounted_rate` says why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedgp import defaults
from fedgp.data.client import ClientData
from fedgp.data.table import RUN_CONFIG_ROLES, read_owner_table
from fedgp.errors import CommandError, EngineError, InputError
from fedgp.flower.capture import capture_mod
from fedgp.flower.client import client_app, read_npz_clients
from fedgp.flower.delay import delay_mod
from fedgp.flower.fast import short_object_pulls
from fedgp.flower.grid_engine import GridEngine
from fedgp.flower.secagg import SecureAggregation
from fedgp.layout import ERROR_FILE, MODEL_FILE, read_columns, write_error, write_model_folder, write_progress
from fedgp.messages import config_json, from_config
from fedgp.models.spec import GPSpec
from fedgp.models.spec_io import build_spec
from fedgp.presets import make_spec, make_strategy
from fedgp.run import Callback, ClientDP, Evaluate, Faults, FitResult, Progress, fit, load
from fedgp.strategies.asynchronous import Asynchronous
from fedgp.strategies.base import Strategy
from fedgp.transforms import Transforms

__all__ = [
    "RUN_CONFIG",
    "AppSettings",
    "TableLoader",
    "RoundLog",
    "clientapp",
    "main",
    "serverapp",
    "write_model",
]

#: The run-config keys of the app and their defaults (``fedgp flower new`` writes them out; a key
#: left out of a run's config takes its default). Zero means "the strategy's default" for the
#: strategy's settings, and an empty string "not given".
RUN_CONFIG: dict[str, Any] = {
    "target": "y",
    "group": "owner",
    "features": "",
    "kernel": defaults.KERNEL,
    "ard": defaults.ARD,
    "mean": defaults.MEAN,
    "model": "",
    "strategy": defaults.STRATEGY,
    "local-steps": 0,
    "batch-size": 0,
    "lr": 0.0,
    "clusters": 0,
    "strategy-config": "",
    "rounds": defaults.ROUNDS,
    "stop": defaults.value("stop", "flower"),
    "transforms": defaults.TRANSFORMS,
    "hide-discrete": defaults.value("hide_discrete", "flower"),
    "seed": defaults.SEED,
    "test-fraction": 0.0,
    "timeout": 300.0,
    "eval-every": 0,
    "out-dir": "fedgp-model",
    "simulation-data": "",
    "privacy": "",
    "secure-aggregation": "",
    "min-contributors": 2,
    "warm-start": "",
}
#: What each run-config key means, for the generated ``pyproject.toml``.
RUN_CONFIG_HELP = {
    "target": "the column to predict",
    "group": "the owner column: rows with one label are one client",
    "features": "input columns, comma-separated (empty: every other column)",
    "kernel": "rbf, matern12, matern32 or matern52 (inside a ScaleKernel)",
    "ard": "one lengthscale per feature",
    "mean": "constant, zero or linear",
    "model": 'instead of kernel/ard/mean: a spec description as JSON ("ard_num_dims": "auto")',
    "strategy": "fgpr or ifca",
    "local-steps": "local steps per round (0: the strategy's default)",
    "batch-size": "minibatch size (0: the strategy's default)",
    "lr": "local learning rate (0: the strategy's default)",
    "clusters": "ifca: number of clusters (0: the default)",
    "strategy-config": "instead of the above: a strategy's JSON config (fedgp.messages.config_json)",
    "rounds": "round budget",
    "stop": "auto (stop when converged; Python's fit runs every round) or none",
    "transforms": "auto (as fit does) or none",
    "hide-discrete": "nodes hide their integer features' box ends from the server (off in Python)",
    "seed": "master seed (sampling, minibatches, the test split)",
    "test-fraction": "share of each owner's rows held out for metrics.csv (0: none)",
    "timeout": "seconds to wait for a round's replies; a node that misses it fails that round",
    "eval-every": "rounds between test metrics in the history (0: only at the end)",
    "out-dir": "where the ServerApp writes model.fedgp, columns.json, history.csv, ... (its host)",
    "simulation-data": "simulation runtime only: one table of all owners, shared out by partition-id",
    "privacy": 'client-level DP: ClientDP settings as JSON, e.g. {"epsilon": 4, "rate": 0.5} (empty: none)',
    "min-contributors": "fewest owners a released sum may add up (below it the round fails, saying why)",
    "secure-aggregation": "sums over nodes only: SecureAggregation JSON, e.g. {} (empty: off)",
    "warm-start": "an earlier run's model folder (server host): start from its state on the nodes' rows",
}


def _setting(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key, RUN_CONFIG[key])
    default = RUN_CONFIG[key]
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputError(f"run config {key!r} must be a {kind.__name__} like {default!r}, got {value!r}")
    return value


@dataclass(frozen=True)
class AppSettings:
    """The app's run config, checked: one place that turns Flower's flat key/value pairs into the
    spec, strategy and ``fit`` options both sides agree on."""

    config: Mapping[str, Any]

    @classmethod
    def of(cls, context: Context) -> AppSettings:
        """The run config of ``context``, refusing keys the app does not read (a typo would
        otherwise silently keep a default)."""
        unknown = sorted(set(context.run_config) - set(RUN_CONFIG))
        if unknown:
            raise InputError(f"unknown run config keys {unknown}; the app reads {sorted(RUN_CONFIG)}")
        return cls(dict(context.run_config))

    def __getitem__(self, key: str) -> Any:
        return _setting(self.config, key)

    @property
    def features(self) -> list[str] | None:
        """The feature columns named by ``features`` (``None``: every other column)."""
        names = [f.strip() for f in self["features"].split(",") if f.strip()]
        return names or None

    def spec(self, d: int) -> GPSpec:
        """The model for data of ``d`` features: from ``model`` (JSON) if given, else by name."""
        if not self["model"]:
            return make_spec(self["kernel"], self["mean"], d=d, ard=self["ard"])
        try:
            desc = json.loads(self["model"])
        except json.JSONDecodeError as err:
            raise InputError(f"run config 'model' is not JSON ({err})") from None
        return build_spec(_auto_width(desc, d))

    def strategy(self) -> Strategy:
        """The strategy: from ``strategy-config`` (JSON) if given, else by name and settings."""
        if self["strategy-config"]:
            try:
                strategy = from_config(json.loads(self["strategy-config"]))
            except json.JSONDecodeError as err:
                raise InputError(f"run config 'strategy-config' is not JSON ({err})") from None
            if not isinstance(strategy, Strategy):
                raise InputError(f"run config 'strategy-config' describes a {type(strategy).__name__}")
            if strategy.keeps_client_memory:  # refused before any round, not after the last
                raise InputError(
                    "run config 'strategy-config': its owners keep personal hyper-parameters, which stay "
                    "on their nodes; the app's model.fedgp holds the server's state only and would predict "
                    "every owner under the initial values. Run it with fedgp.flower.server_app (state, "
                    "history and each owner's test metrics, no model file)"
                )
            return strategy
        settings = {
            "local-steps": "local_steps",
            "batch-size": "batch_size",
            "lr": "lr",
            "clusters": "num_clusters",
        }
        given = {name: self[key] for key, name in settings.items() if self[key]}
        if "num_clusters" in given and self["strategy"] != "ifca":  # named as the run config names it
            raise InputError(f"run config 'clusters' applies to strategy 'ifca', not to {self['strategy']!r}")
        return make_strategy(self["strategy"], **given)

    def fit_options(self) -> dict[str, Any]:
        """``fit``'s ``rounds``, ``seed``, ``stop``, ``transforms`` and ``faults`` (the fewest
        contributors to a released sum) from the run config."""
        stop, transforms = self["stop"], self["transforms"]
        if stop not in ("auto", "none") or transforms not in ("auto", "none"):
            raise InputError(
                f"run config 'stop' and 'transforms' are 'auto' or 'none', got {stop!r}, {transforms!r}"
            )
        return {
            "rounds": self["rounds"],
            "seed": self["seed"],
            "stop": None if stop == "none" else "auto",
            # A deployment's nodes hide their integer-valued features' extremes (Normalize.hide_discrete).
            "transforms": None if transforms == "none" else Transforms(hide_discrete=self["hide-discrete"]),
            "faults": Faults(min_contributors=self["min-contributors"]),
        }

    def warm_start(self) -> tuple[FitResult, dict] | None:
        """The model of the ``warm-start`` folder and its columns (``None`` when empty): an earlier
        run's, whose state this run starts from on the nodes' current rows (``fedgp fit
        --warm-start``'s rule: its kernel and mean, so ``model``/``kernel``/``mean``/``ard`` are
        refused beside it)."""
        folder = self["warm-start"]
        if not folder:
            return None
        given = [key for key in ("model", "kernel", "mean", "ard") if self[key] != RUN_CONFIG[key]]
        if given:
            raise InputError(
                f"run config 'warm-start' continues the model's own kernel and mean; {given} cannot be "
                "given with it"
            )
        path = Path(folder).expanduser()
        try:
            columns = read_columns(path)  # first: says what a folder lacks
            return load(path / MODEL_FILE), columns
        except (CommandError, ValueError) as err:
            raise InputError(f"run config 'warm-start': {err}") from None

    def warm_spec(self, features: list[str], width: int) -> GPSpec:
        """The run's model: the ``warm-start`` model's state as the start (its target and feature
        columns must be the nodes'), else :meth:`spec` for ``width`` features."""
        warm = self.warm_start()
        if warm is None:
            return self.spec(width)
        model, columns = warm
        if columns["target"] != self["target"] or list(columns["features"]) != list(features):
            raise InputError(
                f"run config 'warm-start': the model was fitted to target {columns['target']!r} from "
                f"features {columns['features']}; the nodes' are {self['target']!r} from {features}"
            )
        return model.warm_spec()

    def secure(self) -> SecureAggregation | None:
        """``SecureAggregation`` from the ``secure-aggregation`` JSON (``None`` when empty); refused
        with an ``Asynchronous`` strategy (its buffer mixes replies of several exchanges, and
        secure aggregation releases one exchange's sum)."""
        secure = SecureAggregation.from_json(self["secure-aggregation"])
        if secure is not None and isinstance(self.strategy(), Asynchronous):
            raise InputError(
                "run config 'secure-aggregation' does not combine with an Asynchronous strategy-config: "
                "secure aggregation releases the sum of one exchange's replies, and the asynchronous "
                "server's buffer mixes replies of several exchanges, each weighed by its staleness"
            )
        return secure

    def privacy(self) -> ClientDP | None:
        """The :meth:`strategy` made private, ``ClientDP(strategy, **settings)`` with the settings
        of the ``privacy`` JSON (``None`` when empty): what ``fit`` then trains."""
        if not self["privacy"]:
            return None
        strategy = self.strategy()
        try:
            settings = json.loads(self["privacy"])
            if not isinstance(settings, dict):
                raise TypeError("not a JSON object")
            private = ClientDP(strategy, **settings)
        except (ValueError, TypeError) as err:
            raise InputError(
                f"run config 'privacy' must be ClientDP settings as a JSON object, e.g. "
                f'{{"epsilon": 4, "rate": 0.5}}: {err}'
            ) from None
        if private.epsilon is not None and private.noise is not None:
            # Before the hello: a budget that affords no round at the least the round can be
            # accounted at (its rate) is refused with no message sent; fit re-checks at the
            # rate the engine allows (ClientDP.accounted_rate) once the nodes are known.
            private.check_budget(float(private.noise), float(private.rate), int(self["rounds"]))
        return private


def _node_flag(context: Context, key: str) -> bool:
    """A yes/no node-config value (Flower passes ``true`` as a bool, quoted values as text)."""
    value = context.node_config.get(key, False)
    if isinstance(value, str):
        if value.strip().lower() not in ("true", "false", ""):
            raise InputError(f"node config {key!r} must be true or false, got {value!r}")
        return value.strip().lower() == "true"
    return bool(value)


def _auto_width(desc: Any, d: int) -> Any:
    """``desc`` with every ``"ard_num_dims": "auto"`` replaced by the data's width ``d``."""
    if isinstance(desc, dict):
        return {k: d if (k == "ard_num_dims" and v == "auto") else _auto_width(v, d) for k, v in desc.items()}
    if isinstance(desc, list):
        return [_auto_width(v, d) for v in desc]
    return desc


class TableLoader:
    """A node's owners from ``node_config["data-path"]``: a CSV/Parquet table with the run's owner
    column (checked as ``fedgp fit`` checks it), or a folder of ``*.npz`` clients. Read once per
    process; only this node's process ever reads it."""

    def __init__(self, key: str = "data-path"):
        self.key = key
        self._cache: dict[tuple, tuple[list[ClientData], list[str]]] = {}

    def _source(self, context: Context, settings: AppSettings) -> tuple[Path, tuple[int, int] | None]:
        """The node's table, and its share of the owners when it is a simulated SuperNode."""
        if self.key in context.node_config:
            return Path(str(context.node_config[self.key])).expanduser(), None
        if settings["simulation-data"] and "partition-id" in context.node_config:
            share = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
            return Path(settings["simulation-data"]).expanduser(), share
        raise InputError(
            f"this SuperNode's --node-config has no {self.key!r} (the file of its owners' rows); in "
            "Flower's simulation runtime, name one table of all owners in the run config's 'simulation-data'"
        )

    def _read(self, context: Context) -> tuple[list[ClientData], list[str]]:
        settings = AppSettings.of(context)
        path, share = self._source(context, settings)
        key = (str(path), share, json.dumps(dict(settings.config), sort_keys=True))
        if key not in self._cache:
            if path.is_dir():
                clients = read_npz_clients(path)
                columns = [f"x{i}" for i in range(clients[0].X.shape[-1])]
            else:
                table = read_owner_table(path, group=settings["group"], target=settings["target"],
                                         features=settings.features, roles=RUN_CONFIG_ROLES)  # fmt: skip
                fraction = settings["test-fraction"] or None
                clients = list(table.federation(fraction, settings["seed"]))
                columns = list(table.features)
            if share is not None:  # a simulated SuperNode hosts a contiguous share of the owners
                mine = np.array_split(np.arange(len(clients)), share[1])[share[0]]
                if not len(mine):
                    raise InputError(
                        f"simulated SuperNode {share[0]} of {share[1]} has no owner "
                        f"({path} has {len(clients)})"
                    )
                clients = [clients[i] for i in mine]
            self._cache[key] = (clients, columns)
        return self._cache[key]

    def __call__(self, context: Context) -> tuple[GPSpec, list[ClientData]]:
        clients, _ = self._read(context)
        return AppSettings.of(context).spec(clients[0].X.shape[-1]), clients

    def columns(self, context: Context) -> list[str]:
        """The feature columns this node's table has (sent in the ``hello``: names, not data)."""
        return self._read(context)[1]


class RoundLog(Callback):
    """One INFO line per round through Flower's logger: round, participants, replies, failures
    with their reasons, train NLL and seconds (``flwr log`` and the ServerApp's output show it);
    for an asynchronous server measured as replies arrive, per step: owners sent the version,
    replies consumed and their largest staleness."""

    def on_start(self, run) -> None:
        self._last = time.perf_counter()
        log(INFO, "fedgp: %s over %d clients, up to %d rounds", type(run.strategy).__name__,
            len(run.roster.ids), run.rounds)  # fmt: skip

    def on_round(self, run, row) -> None:
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        failed = int(row.get("failed", 0))
        participants = int(row.get("participants", 0))
        nll = row.get("train_nll", float("nan"))
        if row.get("skipped"):  # ClientDP: too few nodes for the round's sum; accounted, state kept
            log(WARNING, "fedgp round %d/%d skipped (state unchanged, ε accounted): %s", run.completed,
                run.rounds, row.get("failures", ""))  # fmt: skip
            return
        if "wall_time" in row:  # Asynchronous(speeds="measured"): a step on the replies that arrived
            log(INFO, "fedgp step %d/%d: sent to %d, %d replies consumed (staleness max %d), %d failed, "
                "train_nll %.6g, %.2f s", run.completed, run.rounds, participants, int(row["buffered"]),
                int(row["staleness_max"]), failed, nll, seconds)  # fmt: skip
        else:
            log(INFO, "fedgp round %d/%d: %d participants, %d replies, %d failed, train_nll %.6g, %.2f s",
                run.completed, run.rounds, participants, participants - failed, failed, nll,
                seconds)  # fmt: skip
        if failed:
            log(WARNING, "fedgp round %d failures: %s", run.completed, row.get("failures", ""))


def write_model(result: FitResult, folder: str | Path, columns: Mapping[str, Any]) -> list[Path]:
    """What ``fedgp fit`` writes (:func:`fedgp.layout.write_model_folder`, ``model.fedgp`` last),
    with ``metrics.csv`` when owners hold test rows. Returns the paths."""
    metrics = result.evaluate() if bool((result.roster.n_test > 0).any()) else None
    if metrics is None:  # said where the run's output is read, not left to the folder's silence
        log(WARNING, "fedgp: no metrics.csv: no owner holds test rows; set the run config's "
            "test-fraction (e.g. 0.25) to hold out a share of each owner's rows and score them")  # fmt: skip
    return write_model_folder(folder, result, columns, metrics=metrics)


def _discover(grid: Grid, strategy: Strategy, settings: AppSettings) -> tuple[int, list[str]]:
    """The nodes' data width and feature columns, from a ``hello``; every node must agree."""
    probe = GridEngine(grid, make_spec("rbf", "zero", d=1, ard=False), settings["timeout"])
    roster = probe.start(strategy, settings["seed"])
    widths = sorted({int(d) for d in roster.dims.tolist()})
    columns = {json.dumps(c) for c in probe.node_columns.values() if c is not None}
    if len(widths) != 1 or len(columns) > 1:
        raise EngineError(
            f"the nodes' data disagree: widths {widths}, feature columns by node {probe.node_columns}"
        )
    names = json.loads(columns.pop()) if columns else [f"x{i}" for i in range(widths[0])]
    return widths[0], names


def _main(grid: Grid, context: Context) -> None:
    short_object_pulls()  # the replies' objects: retried after 0.02 s, not Flower's first 1 s
    settings = AppSettings.of(context)
    strategy, secure = settings.strategy(), settings.secure()  # a bad setting fails before any exchange
    width, features = _discover(grid, strategy, settings)
    spec = settings.warm_spec(features, width)
    callbacks: list = [Evaluate(every=settings["eval-every"]), RoundLog(), Progress(False)]
    out = Path(settings["out-dir"]).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    callbacks.append(lambda run: write_progress(out, run.completed))
    log(INFO, "fedgp: %d features (%s), strategy %s", width, ", ".join(features), config_json(strategy))
    engine = GridEngine(grid, spec, settings["timeout"], secure)
    private = settings.privacy()  # the strategy made private, with the run config's privacy
    trained = strategy if private is None else private
    result = fit(spec, None, trained, engine=engine, callbacks=callbacks, **settings.fit_options())
    columns = {"group": settings["group"], "target": settings["target"], "features": features,
               "owners": result.roster.ids, "data": None,
               "test_fraction": settings["test-fraction"] or None, "seed": settings["seed"]}  # fmt: skip
    for path in write_model(result, out, columns):
        log(INFO, "fedgp: wrote %s", path)


def _out_dir(context: Context) -> Path:
    """``out-dir`` of the run config as given (or its default), read leniently: a failure is
    reported there even when the run config itself is what failed."""
    return Path(str(context.run_config.get("out-dir", RUN_CONFIG["out-dir"]))).expanduser()


def _one_line(err: BaseException) -> str:
    text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def main(grid: Grid, context: Context) -> None:
    """The ServerApp's ``main``: :func:`_main`, with the run's state kept in ``out-dir``
    (``progress.txt``, ``error.txt``; module docstring). Every run-config setting is checked before
    any message goes out. A failure leaves ``error.txt``, one line, and one ERROR line in the log,
    and is raised for Flower to mark the run failed (a missing extra as an :class:`EngineError`:
    Flower would answer an ``ImportError`` by advising to edit the app's ``pyproject.toml``)."""
    out = _out_dir(context)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ERROR_FILE).unlink(missing_ok=True)
        write_progress(out, 0)
        settings = AppSettings.of(context)
        settings.strategy(), settings.privacy(), settings.secure()  # every setting before any exchange
        settings.warm_start()
        settings.fit_options()
        _main(grid, context)
    except Exception as err:
        reason = _one_line(err)
        try:
            where = write_error(out, reason)
        except OSError as unwritable:
            where = f"not written: {unwritable}"
        log(ERROR, "fedgp: the run failed: %s (%s)", reason, where)
        if isinstance(err, ImportError):
            raise EngineError(reason) from err
        raise


#: The ServerApp (``fedgp.flower.app:serverapp`` in an app's ``pyproject.toml``).
serverapp = ServerApp()
serverapp.main()(main)
#: The ClientApp: owners from ``data-path`` in the node config; messages kept in ``capture-dir``
#: when the node config names one; ``train-delay`` seconds waited before each train task
#: (:mod:`fedgp.flower.delay`: a straggler on demand).
clientapp: ClientApp = client_app(
    TableLoader(), mods=[capture_mod, delay_mod],
    allow_predict=lambda context: _node_flag(context, "allow-predict"),
)  # fmt: skip
