"""Execute notebooks in place so they are committed with outputs.

    python tools/run_notebooks.py notebooks/quickstart.ipynb [...]

Full runs by default; FEDGP_QUICK=1 in the environment gives the quick mode CI uses.
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

for name in sys.argv[1:] or sorted(str(p) for p in Path("notebooks").glob("*.ipynb")):
    nb = nbformat.read(name, as_version=4)
    NotebookClient(nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    nbformat.write(nb, name)
    print("executed", name)
