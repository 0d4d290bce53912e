"""Real-data tests read ``$FEDGP_DATA``; with ``CI=true`` a missing file fails the test, else skips it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def require_real_data(*relative: str) -> Path:
    """The data root holding every ``relative`` path (e.g. ``"cmapss/train_FD001.txt"``)."""
    root = os.environ.get("FEDGP_DATA", "").strip()
    missing = [r for r in relative if not root or not (Path(root) / r).is_file()]
    if missing:
        reason = (
            f"real data file(s) {', '.join(missing)} not found under FEDGP_DATA={root or '<unset>'}; "
            "point FEDGP_DATA at the folder holding cmapss/ and sarcos/ (make test does this)"
        )
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    return Path(root)
