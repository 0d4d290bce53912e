"""A small Flower app for the tests: synthetic data owners, generated on each node from a seed
(as a node would read its own files), and a ServerApp running FGPR or IFCA."""

from __future__ import annotations

import os

import numpy as np

import fedgp
from fedgp.flower import client_app, server_app

CLIENTS, POINTS, DIMS, SEED = 6, 24, 1, 7


def federation():
    return fedgp.synthetic.gp_federation(num_clients=CLIENTS, n=POINTS, d=DIMS, n_test=5, seed=SEED)


def _load(context):
    draws = federation()
    parts = np.array_split(np.arange(CLIENTS), int(context.node_config["num-partitions"]))
    mine = parts[int(context.node_config["partition-id"])]
    return draws.spec, [draws.federation[int(i)] for i in mine]


def strategy(name: str):
    if name == "personal":  # each owner keeps its own noise on its node
        return fedgp.strategies.FGPR(batch_size=8, local_steps=3, personal=("noise",))
    if name == "ifca":
        return fedgp.strategies.IFCA(num_clusters=2, batch_size=8, local_steps=2)
    return fedgp.strategies.FGPR(batch_size=8, local_steps=3)


def _build(context):
    config = context.run_config
    out_dir = config.get("out-dir", os.environ.get("FEDGP_FLOWER_OUT"))  # run_simulation has no run config
    options = {
        "rounds": int(config.get("rounds", os.environ.get("FEDGP_FLOWER_ROUNDS", 3))),
        "seed": int(config.get("seed", 5)),
        "out_dir": str(out_dir),
        "timeout": float(config.get("timeout", 60.0)),
        "callbacks": [fedgp.run.Evaluate(every=0)],
    }
    name = config.get("strategy", os.environ.get("FEDGP_FLOWER_STRATEGY", "fgpr"))
    return federation().spec, strategy(str(name)), options


clientapp = client_app(_load)
serverapp = server_app(_build)
