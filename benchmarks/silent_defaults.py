"""Study of the paths that could give a default where an answer was asked for (issue 49).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/silent_defaults.py \\
        --against /path/to/checkout-at-0656142 --label 0656142

Runs every path of ``tests/silent_paths.py`` — each door (Python, scikit-learn, the CLI, the saved
file, the Flower app) and each way a default could stand in for an answer: an unknown owner, an empty
evaluation, a prior-only prediction, a dropped, renamed or reordered column, a missing test split, what
a saved file forgets — once, and records what it did: ``raises``, ``warns``, ``answers`` (the right
answer, quietly), ``chosen, quiet`` (a default the user chose explicitly) or ``silent default``. With
``--against``, the same paths run in a fresh process on that checkout's fedgp (the cases use only what
fedgp had at 0656142) and its outcomes are added as columns. Writes results/silent_defaults.csv
(``door, path, trigger, chosen, outcome, said`` and, with ``--against``, ``outcome_<label>,
said_<label>``) and prints the table; ``tests/test_silent_defaults.py`` asserts the same outcomes.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _cases():
    """``tests/silent_paths.py`` of this checkout, whichever fedgp is imported."""
    spec = importlib.util.spec_from_file_location("silent_paths", ROOT / "tests" / "silent_paths.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["silent_paths"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _elsewhere(checkout: Path) -> pd.DataFrame:
    """The outcomes on ``checkout``'s fedgp (its ``tests`` package too, for the Flower helpers)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(ROOT)])}
    command = [sys.executable, __file__, "--json"]
    done = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True, check=True)
    return pd.read_json(io.StringIO(done.stdout.strip().splitlines()[-1]), orient="records")


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "silent_defaults.csv")
    parser.add_argument("--against", type=Path, default=None, help="a checkout whose fedgp to run too")
    parser.add_argument("--label", default="before", help="the other checkout's name in the columns")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one line of records
    args = parser.parse_args(argv)
    if not args.json:
        sys.path.insert(0, str(ROOT))
    table = _cases().run_all()
    if args.json:
        print(json.dumps(table.to_dict(orient="records")))
        return table
    if args.against is not None:
        other = _elsewhere(args.against.resolve())[["door", "path", "outcome", "said"]]
        other = other.rename(columns={"outcome": f"outcome_{args.label}", "said": f"said_{args.label}"})
        table = table.merge(other, on=["door", "path"], how="left")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    shown = [c for c in table.columns if not c.startswith("said") and c not in ("trigger", "chosen")]
    with pd.option_context("display.width", 160):
        print(table[shown].to_string(index=False))
    counts = table.groupby("outcome").size().to_dict()
    print(f"\n{len(table)} paths: {counts}")
    return table


if __name__ == "__main__":
    main()
