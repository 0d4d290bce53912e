"""Fuzz study of the data entry points: ClientData, Federation, Federation.from_partition.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fuzz_inputs.py --examples 1200 --fits 100

Generates ``--examples`` inputs with the hypothesis strategies of the property-based tests
(``tests/data/fuzz_contract.py``, derandomised: the same inputs every run), judges each against
the documented contract and counts the outcomes per entry point: crash, unclear, silent-change,
valid-rejected, accepted, rejected-clearly (defined in ``fuzz_contract``). For the first ``--fits``
accepted federations it also runs one FGPR round on both engines and counts ``fit-ok`` or
``fit-fails-naming-client`` (and ``fit-unclear`` when the error names no client of the federation).
Writes results/fuzz.csv (``entry_point, outcome, count``) and prints one example per bad outcome.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parents[1]


def _setup(against: Path | None):
    """Import fedgp from this checkout (or ``against``, e.g. an older checkout) and the contract."""
    import importlib.util

    sys.path.insert(0, str(against or ROOT))
    spec = importlib.util.spec_from_file_location(
        "fuzz_contract", ROOT / "tests" / "data" / "fuzz_contract.py"
    )
    contract = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_contract"] = contract  # dataclasses look their module up
    spec.loader.exec_module(contract)
    return contract


BAD = ("crash", "unclear", "silent-change", "valid-rejected", "fit-unclear")


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1200)
    parser.add_argument("--fits", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "fuzz.csv")
    parser.add_argument("--against", type=Path, default=None, help="checkout whose fedgp to test")
    args = parser.parse_args(argv)
    contract = _setup(args.against)
    CASES, outcome = contract.CASES, contract.outcome

    counts: collections.Counter = collections.Counter()
    examples: dict[str, str] = {}
    fits_left = [args.fits]

    @settings(
        max_examples=args.examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(CASES)
    def run(case):
        category, detail = outcome(case)
        counts[(case.kind, category)] += 1
        if category in BAD:
            examples.setdefault(category, f"{case.kind}: {detail}")
        if category == "accepted" and fits_left[0] > 0:
            fits_left[0] -= 1
            for label in contract.one_round_on_each_engine(case.built):
                label, _, detail = label.partition(": ")
                counts[(case.kind, label)] += 1
                if label in BAD:
                    examples.setdefault(label, f"{case.kind}: {detail}")

    run()
    table = pd.DataFrame(
        [{"entry_point": kind, "outcome": cat, "count": n} for (kind, cat), n in sorted(counts.items())]
    )
    totals = table.groupby("outcome", as_index=False)["count"].sum().assign(entry_point="all")
    table = pd.concat([table, totals[["entry_point", "outcome", "count"]]], ignore_index=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))
    tried = int(totals.loc[~totals["outcome"].str.startswith("fit-"), "count"].sum())
    print(f"\n{tried} inputs tried; bad outcomes: {dict((k, v) for k, v in examples.items()) or 'none'}")
    return table


if __name__ == "__main__":
    main()
