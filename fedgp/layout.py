"""The files of a model folder: what ``fedgp fit --out`` and fedgp's Flower app (``out-dir``)
write, and what ``fedgp predict`` reads. One place, so that the two writers cannot drift apart."""

from __future__ import annotations

__all__ = ["MODEL_FILE", "COLUMNS_FILE"]

#: The saved model (``FitResult.save``'s sealed container, :mod:`fedgp.run.saved`; ``fedgp.load``).
MODEL_FILE = "model.fedgp"
#: The feature, target and owner columns the model was trained on (JSON), which ``fedgp predict``
#: reads to know which columns of a new table are its inputs.
COLUMNS_FILE = "columns.json"
