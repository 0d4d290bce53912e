"""The Flower app of federated BO: fedgp's app (:mod:`fedgp.flower.app`) with each owner's black box
and evaluations on its own SuperNode (:mod:`fedgp.bo.node`), driven by :class:`~fedgp.bo.FlowerBO`.

An app folder names ``fedgp.bo.app:serverapp`` and ``fedgp.bo.app:clientapp``
(:func:`bo_pyproject` writes its ``pyproject.toml``). What each side reads:

* **a SuperNode** (``--node-config``): ``bo-objective``, ``bo-bounds`` and the optional ``bo-owner``,
  ``bo-report``, ``bo-optimum``, ``bo-truth`` (:mod:`fedgp.bo.node`), and fedgp's node keys
  (``capture-dir``, the ``secagg-*`` policy).
* **the run** (``--run-config``): fedgp's app's keys for the model (``kernel``/``mean``/``ard`` or
  ``model``), the strategy (``strategy`` and its settings, or ``strategy-config``), ``seed``,
  ``timeout``, ``out-dir``, ``min-contributors``, ``privacy`` and ``secure-aggregation``; and BO's
  own (:data:`BO_CONFIG`). fedgp's keys a BO run has no use for (its rounds are ``bo-rounds``; the
  nodes have no table) are refused when given another value than their default.

Into ``out-dir``: ``progress.txt`` (the iterations done), ``bo-history.csv`` (one row per iteration
and owner, :class:`~fedgp.bo.BOLoop`'s columns as the nodes report them), ``bo-failures.csv`` (nodes
dropped and why), and last ``model.fedgp`` (the last federated fit); ``error.txt`` if it failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedgp.bo.deployment import FlowerBO
from fedgp.bo.federated import FederatedBO
from fedgp.bo.node import handle_bo, node_clients, node_owner
from fedgp.errors import InputError
from fedgp.flower.app import RUN_CONFIG, AppSettings, _one_line, _out_dir
from fedgp.flower.capture import capture_mod
from fedgp.flower.client import client_app, node_engine
from fedgp.flower.fast import short_object_pulls
from fedgp.flower.template import app_pyproject
from fedgp.layout import ERROR_FILE, MODEL_FILE, write_error, write_progress
from fedgp.run import Faults

__all__ = ["BO_CONFIG", "BO_CONFIG_HELP", "bo_settings", "bo_pyproject", "serverapp", "clientapp"]

#: BO's run-config keys and their defaults.
BO_CONFIG: dict[str, Any] = {
    "bo-iterations": 10,
    "bo-initial": 3,
    "bo-rounds": 5,
    "bo-initial-rounds": 50,
    "bo-acquisition": "qlogei",
    "bo-beta": 2.0,
    "bo-restarts": 4,
    "bo-raw-samples": 128,
}
#: What each BO run-config key means, for the generated ``pyproject.toml``.
BO_CONFIG_HELP = {
    "bo-iterations": "BO iterations (each: every node proposes and evaluates once, then bo-rounds rounds)",
    "bo-initial": "starting points each node evaluates (uniform in its bo-bounds)",
    "bo-rounds": "federated rounds after each iteration, warm-started",
    "bo-initial-rounds": "federated rounds on the starting points",
    "bo-acquisition": "qlogei, qucb or ts",
    "bo-beta": "qucb's beta",
    "bo-restarts": "optimize_acqf's num_restarts",
    "bo-raw-samples": "optimize_acqf's raw_samples",
}
#: fedgp's app keys that a BO run does not read (refused unless at their default).
UNREAD = ("rounds", "stop", "transforms", "hide-discrete", "test-fraction", "eval-every", "target",
          "group", "features", "simulation-data", "warm-start")  # fmt: skip


def bo_settings(config: dict[str, Any]) -> tuple[AppSettings, dict[str, Any]]:
    """fedgp's checked settings and BO's from a run config (unknown keys, and fedgp keys a BO run
    does not read given other values than their defaults, refused naming them)."""
    unknown = sorted(set(config) - set(RUN_CONFIG) - set(BO_CONFIG))
    if unknown:
        raise InputError(
            f"unknown run config keys {unknown}; a BO run reads {sorted({**RUN_CONFIG, **BO_CONFIG})}"
        )
    unread = [k for k in UNREAD if k in config and config[k] != RUN_CONFIG[k]]
    if unread:
        raise InputError(f"run config {unread}: a BO run does not read these (its rounds are 'bo-rounds')")
    bo = {}
    for key, default in BO_CONFIG.items():
        value = config.get(key, default)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, type(default)):
            raise InputError(
                f"run config {key!r} must be a {type(default).__name__} like {default!r}, got {value!r}"
            )
        bo[key] = value
    return AppSettings({k: v for k, v in config.items() if k in RUN_CONFIG}), bo


def method(settings: AppSettings, bo: dict[str, Any], width: int) -> FederatedBO:
    """The :class:`FederatedBO` a run config describes, for owners searching ``width`` inputs."""
    from fedgp.bo.acquisition import Acquisition

    strategy = settings.privacy() or settings.strategy()
    acquisition = Acquisition(bo["bo-acquisition"], bo["bo-beta"], bo["bo-restarts"], bo["bo-raw-samples"])
    return FederatedBO(settings.spec(width), strategy, bo["bo-rounds"],
                       initial_rounds=bo["bo-initial-rounds"],
                       engine="sequential", acquisition=acquisition,
                       faults=Faults(min_contributors=settings["min-contributors"]))  # fmt: skip


def _main(grid: Grid, context: Context) -> None:
    short_object_pulls()
    settings, bo = bo_settings(dict(context.run_config))
    out = Path(settings["out-dir"]).expanduser()
    secure = settings.secure()
    loop = FlowerBO(grid, lambda width: method(settings, bo, width), bo["bo-iterations"],
                    initial=bo["bo-initial"], seed=settings["seed"], timeout=settings["timeout"],
                    secure=secure,
                    callbacks=[lambda loop: write_progress(out, loop.iteration)])  # fmt: skip
    result = loop.run()
    result.history.to_csv(out / "bo-history.csv", index=False)
    result.failures.to_csv(out / "bo-failures.csv", index=False)
    result.method.result.save(out / MODEL_FILE)
    log(
        INFO,
        "fedgp BO: %d iterations, %d owners dropped; wrote %s",
        loop.iteration,
        len(result.failures),
        out,
    )


def main(grid: Grid, context: Context) -> None:
    """The ServerApp's ``main``: :func:`_main`, with its state in ``out-dir`` (``progress.txt``,
    ``error.txt``: one line, as fedgp's app writes it)."""
    out = _out_dir(context)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ERROR_FILE).unlink(missing_ok=True)
        write_progress(out, 0)
        _main(grid, context)
    except Exception as err:
        reason = _one_line(err)
        log(ERROR, "fedgp BO: the run failed: %s (%s)", reason, write_error(out, reason))
        raise


def _load(context: Context):
    """A BO node's federation client: its evaluations (the model from the run config and its width)."""
    settings, _ = bo_settings(dict(context.run_config))
    return settings.spec(node_owner(context).dim), node_clients(context)


def bo_clientapp(mods: Sequence = ()) -> ClientApp:
    """The ClientApp of a BO owner: fedgp's, hosting the node's evaluations, answering ``query.bo``;
    ``capture-dir`` in the node config keeps every message (:func:`~fedgp.flower.capture_mod`), and
    ``mods`` wrap every message besides."""
    app = client_app(_load, mods=[capture_mod, *mods])
    config = node_engine("sequential")
    app.query("bo")(lambda message, context: handle_bo(message, context, _load, config))
    return app


def bo_pyproject(name: str = "fedgp-bo-app") -> str:
    """The ``pyproject.toml`` of a federated-BO Flower app called ``name``: fedgp's app's, naming
    this module's components, with BO's run-config keys."""
    text = app_pyproject(name).replace("fedgp.flower.app:", "fedgp.bo.app:")
    width = max(len(f"{k} = {v!r}") for k, v in BO_CONFIG.items())
    lines = [f"{f'{k} = {_toml(v)}':<{width}}  # {BO_CONFIG_HELP[k]}" for k, v in BO_CONFIG.items()]
    return text + "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    return repr(value) if isinstance(value, float) else f'"{value}"' if isinstance(value, str) else str(value)


#: The ServerApp (``fedgp.bo.app:serverapp``).
serverapp = ServerApp()
serverapp.main()(main)
#: The ClientApp (``fedgp.bo.app:clientapp``).
clientapp: ClientApp = bo_clientapp()
