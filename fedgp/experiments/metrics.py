"""Errors of estimated cluster models against the truth, up to relabelling."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

__all__ = ["max_matched_error", "mean_matched_error", "nearest_truth_error"]


def _dist(estimates, truths) -> np.ndarray:
    est = torch.as_tensor(np.ascontiguousarray(estimates), dtype=torch.float64).reshape(len(estimates), -1)
    tru = torch.as_tensor(np.ascontiguousarray(truths), dtype=torch.float64).reshape(len(truths), -1)
    return torch.cdist(est, tru).numpy()  # (k_est, k)


def max_matched_error(estimates, truths) -> float:
    """Su, Xu & Yang's ``d(θ̂, θ*) = min_π max_j ‖θ̂_π(j) − θ*_j‖`` (eq. 6).

    Exhaustive over permutations for k ≤ 7, else a bottleneck assignment (the smallest threshold
    with a perfect matching, found with the Hungarian algorithm on the thresholded costs). With
    fewer estimates than truths (k = 1: FedAvg) it is ``max_j min_l ‖θ̂_l − θ*_j‖``: every true
    model is charged its nearest estimate.
    """
    D = _dist(estimates, truths)
    k_est, k = D.shape
    if k_est < k:
        return float(D.min(axis=0).max())
    if k <= 7 and k_est == k:
        return float(min(max(D[p[j], j] for j in range(k)) for p in itertools.permutations(range(k))))
    for t in np.unique(D):
        cost = np.where(D <= t, 0.0, 1.0)
        rows, cols = linear_sum_assignment(cost)
        if cost[rows, cols].sum() == 0:
            return float(t)
    raise AssertionError("unreachable")


def mean_matched_error(estimates, truths) -> float:
    """IFCA's ``(1/k) Σ_j ‖θ̂_π(j) − θ*_j‖`` with π the Hungarian (minimum-sum) matching."""
    D = _dist(estimates, truths)
    rows, cols = linear_sum_assignment(D)
    return float(D[rows, cols].mean())


def nearest_truth_error(estimates, truths) -> float:
    """The IFCA authors' code: ``mean_j min_j' ‖θ̂_j − θ*_j'‖`` (each estimate to its nearest truth)."""
    return float(_dist(estimates, truths).min(axis=1).mean())


def markdown_table(df, floatfmt: str = ".4g") -> str:
    """A GitHub markdown table of a DataFrame (no optional dependency such as ``tabulate``)."""

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return "nan" if np.isnan(v) else format(float(v), floatfmt)
        return str(v)

    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)
