"""``fedgp.data`` is the ground floor: importing it loads no model and no GPyTorch.

Each import runs in a fresh interpreter, so what an earlier test imported cannot hide an arrow up.
The real data sets' loaders (``fedgp.datasets``) stand on the same floor of dependencies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import {module}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("fedgp", "gpytorch"))))
"""


def loaded_by(module: str) -> list[str]:
    """The fedgp and GPyTorch modules that ``import module`` loads in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["fedgp.data", "fedgp.datasets"])
def test_importing_the_data_floor_loads_no_model_and_no_gpytorch(module):
    loaded = loaded_by(module)
    assert module in loaded  # the probe saw the import
    above = [m for m in loaded if m == "gpytorch" or m.startswith(("gpytorch.", "fedgp.models"))]
    assert not above, f"import {module} loads {above}"
