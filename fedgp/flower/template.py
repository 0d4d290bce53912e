"""``fedgp flower new DIR``: a ready Flower app folder running fedgp's own app (:mod:`fedgp.flower.app`).

The folder holds only a ``pyproject.toml``: the components are fedgp's ``ServerApp`` and
``ClientApp``, and ``[tool.flwr.app.config]`` lists every run-config key with its default and what
it means, so a deployment is set up by editing that table (or ``flwr run --run-config``) and each
SuperNode's ``--node-config "data-path=..."``; no code. No dependencies are declared: the SuperLink
and every SuperNode run where ``fedgp-gpytorch[flower]`` is installed, with runtime dependency
installation disabled (otherwise Flower would resolve a multi-GB CUDA torch on each machine).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fedgp.errors import InputError
from fedgp.flower.app import RUN_CONFIG, RUN_CONFIG_HELP

__all__ = ["app_pyproject", "write_app"]


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)  # strings and ints: TOML's basic strings share JSON's escapes


def app_pyproject(name: str = "fedgp-app") -> str:
    """The ``pyproject.toml`` of a fedgp Flower app called ``name``."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise InputError(f"an app name is letters, digits, '.', '_' and '-', got {name!r}")
    width = max(len(f"{k} = {_toml_value(v)}") for k, v in RUN_CONFIG.items())
    config = "\n".join(
        f"{f'{k} = {_toml_value(v)}':<{width}}  # {RUN_CONFIG_HELP[k]}" for k, v in RUN_CONFIG.items()
    )
    return f"""# A Flower app running fedgp (written by `fedgp flower new`). Each SuperNode names its owners'
# rows in its node config: flower-supernode ... --node-config 'data-path="owners.csv"'
# (a CSV or Parquet table with the owner column below, or a folder of .npz clients).
# No dependencies are declared: fedgp-gpytorch[flower] is installed beside the SuperLink and every
# SuperNode, which run with runtime dependency installation disabled.
[project]
name = "{name}"
version = "1.0.0"
description = "Federated GP regression with fedgp on Flower"
license = "MIT"
dependencies = []

[tool.flwr.app]
publisher = "fedgp"

[tool.flwr.app.components]
serverapp = "fedgp.flower.app:serverapp"
clientapp = "fedgp.flower.app:clientapp"

[tool.flwr.app.config]
{config}
"""


def write_app(folder: str | Path, name: str | None = None) -> Path:
    """Write the app folder (``folder/pyproject.toml``); refuses to overwrite an existing one."""
    folder = Path(folder)
    target = folder / "pyproject.toml"
    if target.exists():
        raise InputError(f"{target} already exists; choose a new folder")
    text = app_pyproject(name or folder.resolve().name)
    folder.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target
