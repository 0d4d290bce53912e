"""Flower for fedgp: the same strategies, one process per data owner (or silo).

* :mod:`fedgp.flower.app` — fedgp's own ServerApp and ClientApp for any data, configured by run
  config and node config (``fedgp flower new DIR`` writes an app folder: :func:`write_app`).

* :func:`client_app` — the ``ClientApp`` a node runs: it loads its own clients' data
  (:func:`npz_loader` reads a folder named in ``node_config``) and runs their side of every round.
* :func:`server_app` — a ``ServerApp`` whose ``main`` runs ``fedgp.fit`` over Flower's ``Grid``
  (:class:`GridEngine`), with fedgp's seeded sampling and failure-tolerant rounds.
* ``engine="flower"`` or ``engine=Flower(num_nodes=...)`` (:class:`FlowerEngine`) — both sides in one
  process over an in-memory grid.
* :class:`SecureAggregation` — the server learns summed fields only as the sum over the nodes that
  completed a round (:mod:`fedgp.flower.secagg`), on a deployment and in process.

Needs the extra: ``pip install "fedgp-gpytorch[flower]"`` (without it, importing this package raises
fedgp's :class:`~fedgp.errors.MissingExtraError` saying so).
"""

from fedgp.errors import MissingExtraError, missing_extra

try:
    from fedgp.flower.app import AppSettings, RoundLog, TableLoader, write_model
    from fedgp.flower.capture import capture_mod
    from fedgp.flower.client import client_app, npz_loader, read_npz_clients, save_npz_clients
    from fedgp.flower.delay import delay_mod
    from fedgp.flower.grid_engine import GridEngine
    from fedgp.flower.local import Flower, FlowerEngine, LocalGrid
    from fedgp.flower.secagg import SecureAggregation
    from fedgp.flower.server import server_app, write_outputs
    from fedgp.flower.template import write_app
except ModuleNotFoundError as err:  # one line naming the extra, in every door
    if isinstance(err, MissingExtraError) or (err.name or "").split(".")[0] == "fedgp":
        raise
    raise missing_extra("flwr", "fedgp.flower", err.name) from err

__all__ = [
    "AppSettings",
    "RoundLog",
    "TableLoader",
    "write_model",
    "write_app",
    "client_app",
    "capture_mod",
    "delay_mod",
    "server_app",
    "npz_loader",
    "read_npz_clients",
    "save_npz_clients",
    "write_outputs",
    "GridEngine",
    "Flower",
    "FlowerEngine",
    "LocalGrid",
    "SecureAggregation",
]
