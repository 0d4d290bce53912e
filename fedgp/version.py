"""fedgp's distribution name and installed version (no other import, so any module may ask)."""

from __future__ import annotations

from importlib import metadata as _metadata

__all__ = ["DISTRIBUTION", "__version__"]

DISTRIBUTION = "fedgp-gpytorch"
"""The name on PyPI: ``fedgp`` there is an unrelated package, so fedgp is installed as this."""


def _installed_version() -> str:
    try:
        return _metadata.version(DISTRIBUTION)
    except _metadata.PackageNotFoundError:  # a source tree that was never installed says so
        return "0+unknown"


__version__ = _installed_version()
"""The installed version of fedgp (``0+unknown`` in a source tree that was never installed)."""
