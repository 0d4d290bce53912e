"""Every notebook in notebooks/ executes top to bottom in quick mode (FEDGP_QUICK=1).

A notebook that reads real data lists the files in its metadata (``"fedgp": {"requires_data":
[...]}``, paths under ``$FEDGP_DATA``); without them it is skipped, or fails when ``CI=true``, like
every other real-data test.
"""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.datasets.real import require_real_data

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert any(p.name == "quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_quick_mode(path, monkeypatch):
    monkeypatch.setenv("FEDGP_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    required = nb.metadata.get("fedgp", {}).get("requires_data", [])
    if required:
        require_real_data(*required)
    assert all(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), (
        f"{path.name} must be committed with outputs"
    )
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
