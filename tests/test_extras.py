"""Optional extras: a feature whose extra is not installed says so in one line, the same in every
door (Python, the CLI, the Flower app): ``<feature> needs '<module>' (the '<extra>' extra): pip
install "fedgp-gpytorch[<extra>]"`` (issue 49: ClientDP failed with ``ModuleNotFoundError:
dp_accounting`` in the Flower app, ``to_botorch`` named ``pip install 'botorch==0.18.1'``).

Each door runs in a fresh interpreter with the extra's module made unimportable (``sys.modules[name]
= None``: what Python does for a module that is not installed), so nothing this process imported
earlier hides the error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from fedgp.errors import EXTRAS, MissingExtraError, extra_of, missing_extra

REPO = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=600, env=ENV
    )


def _expect(message: str, module: str, extra: str) -> None:
    assert "\n" not in message.strip(), message
    assert f"needs '{module}' (the '{extra}' extra): pip install \"fedgp-gpytorch[{extra}]\"" in message, (
        message
    )


def test_the_extras_are_the_ones_pyproject_declares_and_name_importable_modules():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(declared) - {"dev"}
    import importlib.util

    for extra, modules in EXTRAS.items():
        for module in modules:
            assert extra_of(f"{module}.sub") == extra
            if extra != "gpu":  # triton: CPU machines may lack it
                assert importlib.util.find_spec(module) is not None, f"{module} ({extra}) is not importable"


def test_the_message_is_one_line_naming_the_install():
    err = missing_extra("dp_accounting.rdp", "ClientDP")
    assert (
        isinstance(err, MissingExtraError)
        and isinstance(err, ModuleNotFoundError)
        and err.name == "dp_accounting"
    )
    assert (
        str(err)
        == "ClientDP needs 'dp_accounting' (the 'privacy' extra): pip install \"fedgp-gpytorch[privacy]\""
    )
    broken = missing_extra("dp_accounting", "ClientDP", "tree")
    assert broken.name == "tree" and "cannot import 'tree'" in str(broken)


PYTHON_DOORS = r"""
import json, sys
BLOCKED = {"flwr": "flower", "sklearn": "sklearn", "ray": "ray", "botorch": "botorch",
           "dp_accounting": "privacy", "pyarrow": "parquet", "statsmodels": "bench"}
for name in BLOCKED:
    sys.modules[name] = None  # as if not installed
import torch, fedgp
from fedgp.errors import MissingExtraError

data = fedgp.synthetic.gp_federation(num_clients=2, n=6, d=1, seed=0)
result = fedgp.fit(data.spec, data.federation, rounds=1, engine="sequential",
                   callbacks=[fedgp.run.Progress(False)])
with open("t.parquet", "wb") as f:
    f.write(b"PAR1")

def door(name, module, call):
    try:
        call()
    except MissingExtraError as err:
        print(json.dumps([name, module, BLOCKED[module], str(err), err.name]))
    except BaseException as err:
        print(json.dumps([name, module, BLOCKED[module], f"{type(err).__name__}: {err}", None]))
    else:
        print(json.dumps([name, module, BLOCKED[module], "no error", None]))

def import_flower():
    import fedgp.flower
def from_sklearn():
    from fedgp.sklearn import FederatedGPRegressor
def fit_on(engine):
    return lambda: fedgp.fit(data.spec, data.federation, rounds=1, engine=engine)
def read_parquet():
    from fedgp.data.table import read_owner_table
    read_owner_table("t.parquet", group="owner")
def grunfeld():
    from fedgp.experiments.convergence import grunfeld
    grunfeld()

door("fedgp.flower", "flwr", lambda: fedgp.flower)
door("import fedgp.flower", "flwr", import_flower)
door("fedgp.sklearn", "sklearn", from_sklearn)
door("engine='flower'", "flwr", fit_on("flower"))
door("engine='ray'", "ray", fit_on("ray"))
door("to_botorch", "botorch", lambda: result.to_botorch(0))
door("ClientDP", "dp_accounting", lambda: fedgp.run.ClientDP(epsilon=1.0))
door("Parquet", "pyarrow", read_parquet)
door("grunfeld", "statsmodels", grunfeld)
"""


def test_every_python_door_names_the_extra(tmp_path):
    done = _run(PYTHON_DOORS, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    assert len(rows) == 9, done.stdout
    for name, module, extra, message, missing in rows:
        _expect(message, module, extra)
        assert missing == module, (name, message)


CLI_DOORS = r"""
import json, sys
from pathlib import Path
sys.modules[sys.argv[1]] = None
from fedgp.cli import main
Path("t.parquet").write_bytes(b"PAR1")
code = main(sys.argv[2:])
print(json.dumps(code))
"""


@pytest.mark.parametrize(
    "module, extra, argv",
    [
        ("flwr", "flower", ["flower", "new", "app"]),
        ("pyarrow", "parquet", ["fit", "t.parquet", "--target", "y", "--group", "owner", "--quiet"]),
    ],
)
def test_every_cli_door_names_the_extra_in_one_line_with_exit_2(tmp_path, module, extra, argv):
    command = [sys.executable, "-c", CLI_DOORS, module, *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=600)
    assert done.stdout.strip().splitlines()[-1] == "2", done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in done.stderr, done.stderr
    _expect(err[0], module, extra)
