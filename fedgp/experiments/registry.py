"""Paper reproductions the CLI can run: ``fedgp reproduce NAME``.

Each entry maps a name to ``"module:function"``; the function has the signature
``reproduce(repeats: int | None, out_dir: pathlib.Path, seed: int, quick: bool, progress: bool | None)
-> list[pathlib.Path]`` (the files it wrote: CSV and markdown at least). Modules are imported only
when their reproduction is asked for, so one heavy experiment never slows the others' start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["REPRODUCTIONS", "get_reproduction"]

#: ``fedgp reproduce NAME`` -> ``"module:function"`` of its ``reproduce`` function.
REPRODUCTIONS: dict[str, str] = {
    "mixed-regression": "fedgp.experiments.mixed_regression:reproduce",
    "ifca-synthetic": "fedgp.experiments.ifca_synthetic:reproduce",
    "clustered-gp": "fedgp.experiments.clustered_gp:reproduce",
    "table1": "fedgp.experiments.table1:reproduce",
    "table2": "fedgp.experiments.table2:reproduce",
    "table3": "fedgp.experiments.table3:reproduce",
    "failures": "fedgp.experiments.failures:reproduce",
    "werner-synthetic": "fedgp.experiments.werner_synthetic:reproduce",
    "werner-gp": "fedgp.experiments.werner_gp:reproduce",
    "robust-fgpr": "fedgp.experiments.robust_fgpr:reproduce",
    "own-data": "fedgp.experiments.own_data:reproduce",
    "prior-map": "fedgp.experiments.prior_map:reproduce",
    "botorch-loop": "fedgp.experiments.botorch_loop:reproduce",
    "verdicts": "fedgp.experiments.verdicts:reproduce",
}


def get_reproduction(name: str) -> Callable:
    """The ``reproduce`` function registered under ``name`` (imported only now); an unknown name exits with
    the list of known ones."""
    try:
        target = REPRODUCTIONS[name]
    except KeyError:
        known = ", ".join(sorted(REPRODUCTIONS)) or "none yet"
        raise SystemExit(f"fedgp reproduce: unknown experiment {name!r}; available: {known}") from None
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)
