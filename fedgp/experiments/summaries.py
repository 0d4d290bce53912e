"""Per-client metrics of repeated runs, summarised as the FGPR paper's Tables 2 and 3 are.

Both tables report, per method, the mean over repeats of (a) the mean and (b) the standard
deviation across clients of the per-client RMSE, ×10; the paper's bracketed numbers are the
standard deviations of (a) and (b) over repeats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["per_repeat", "over_repeats_x10"]


def per_repeat(per_client: pd.DataFrame, keys: Sequence[str], count: str) -> pd.DataFrame:
    """Per ``keys`` and repeat: mean and (population) std across clients of the RMSE, mean NLL and
    95% coverage, and the number of clients in a column named ``count``."""
    g = per_client.groupby([*keys, "repeat"], sort=False)
    return g.agg(
        rmse_mean=("rmse", "mean"),
        rmse_std=("rmse", lambda v: float(np.std(v))),
        nll_mean=("nll", "mean"),
        coverage95_mean=("coverage95", "mean"),
        **{count: ("rmse", "size")},
    ).reset_index()


def _sd_x10(v: pd.Series) -> float:
    return 10 * v.std(ddof=1) if len(v) > 1 else np.nan


def over_repeats_x10(rep: pd.DataFrame, keys: Sequence[str], spread: bool = False) -> pd.DataFrame:
    """Means over repeats of :func:`per_repeat`'s rows, RMSEs ×10; ``spread`` adds the std over
    repeats of both RMSE columns (``*_sd``, the paper's bracketed numbers)."""
    aggs: dict[str, tuple] = {"rmse_mean_x10": ("rmse_mean", lambda v: 10 * v.mean())}
    if spread:
        aggs["rmse_mean_x10_sd"] = ("rmse_mean", _sd_x10)
    aggs["rmse_std_x10"] = ("rmse_std", lambda v: 10 * v.mean())
    if spread:
        aggs["rmse_std_x10_sd"] = ("rmse_std", _sd_x10)
    aggs |= {
        "nll_mean": ("nll_mean", "mean"),
        "coverage95_mean": ("coverage95_mean", "mean"),
        "repeats": ("repeat", "nunique"),
    }
    return rep.groupby(list(keys), sort=False).agg(**aggs).reset_index()
