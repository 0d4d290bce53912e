"""Quick mode: one switch (``FEDGP_QUICK=1``) that shrinks rounds and repeats everywhere.

Notebooks and the CLI read it so that CI can execute every notebook top to bottom in minutes,
while the committed outputs come from full runs.
"""

from __future__ import annotations

import os

__all__ = ["quick_mode", "scaled"]


def quick_mode() -> bool:
    """True when the environment variable ``FEDGP_QUICK`` is set to a true value."""
    return os.environ.get("FEDGP_QUICK", "").strip().lower() in ("1", "true", "yes", "on")


def scaled(full: int, quick: int) -> int:
    """``quick`` in quick mode, else ``full``."""
    return quick if quick_mode() else full
