"""The ServerApp: ``fedgp.fit`` over the SuperNodes, with the run config of ``pyproject.toml``."""

from fedgp.flower import server_app
from fedgp.run import Evaluate

from .task import spec, strategy


def build(context):
    config = context.run_config
    options = {
        "rounds": int(config["rounds"]),
        "seed": int(config["seed"]),
        "timeout": float(config["timeout"]),
        "out_dir": str(config["out-dir"]),
        "callbacks": [Evaluate(every=int(config["eval-every"]))],
    }
    return spec(int(config["dims"])), strategy(str(config["strategy"])), options


app = server_app(build)
