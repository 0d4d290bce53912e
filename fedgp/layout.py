"""The files of a model folder: what ``fedgp fit --out`` and fedgp's Flower app (``out-dir``)
write, and what ``fedgp predict`` reads. One place, so that the two writers cannot drift apart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MODEL_FILE", "COLUMNS_FILE", "COLUMNS_FORMAT", "write_columns"]

#: The saved model (``FitResult.save``'s sealed container, :mod:`fedgp.run.saved`; ``fedgp.load``).
MODEL_FILE = "model.fedgp"
#: The feature, target and owner columns the model was trained on (JSON), which ``fedgp predict``
#: reads to know which columns of a new table are its inputs.
COLUMNS_FILE = "columns.json"
#: The ``format`` field of a ``columns.json`` (what ``fedgp predict`` checks before trusting it).
COLUMNS_FORMAT = "fedgp.cli.columns"


def write_columns(
    folder: Path,
    *,
    group: str,
    target: str,
    features: Sequence[str],
    owners: Sequence,
    data: str | None,
    test_fraction: float | None,
    seed: int,
) -> Path:
    """Write ``folder/columns.json``: the columns a model was trained on, its owners (as text), the
    training table (``None`` where none was one file) and the test split's fraction and seed."""
    columns = {"format": COLUMNS_FORMAT, "version": 1, "group": group, "target": target,
               "features": list(features), "owners": [str(o) for o in owners], "data": data,
               "test_fraction": test_fraction, "seed": seed}  # fmt: skip
    path = Path(folder) / COLUMNS_FILE
    path.write_text(json.dumps(columns, indent=2) + "\n")
    return path
