"""The numbers the papers print, and the one rule that sets ours beside them.

The reproductions (:mod:`~fedgp.experiments.table1`, :mod:`~fedgp.experiments.table2`,
:mod:`~fedgp.experiments.table3`, :mod:`~fedgp.experiments.werner_synthetic`) and the verdict table
(:mod:`~fedgp.experiments.verdicts`) all read them from here. This module imports no experiment, so
every table can judge its own rows and the verdict table can read every table's numbers without a
circle of imports.

The rule (:func:`verdict`) is two-sided, on the paper's own scale:

1. a ratio of 3 or more either way between ours and the paper's (both positive) is
   ``"different protocol"``: something other than the method differs, to be investigated — never
   counted as a success, however large the spreads;
2. otherwise ``"reproduced"`` when ``|ours − paper| ≤ max(paper's std, our std, tolerance)``;
3. otherwise ``"better"`` or ``"worse"``, by the quantity's direction (lower is better for RMSE, NLL
   and errors; higher for accuracy or coverage).
"""

from __future__ import annotations

import math

import pandas as pd

from fedgp.errors import InputError

__all__ = [
    "PAPER_TABLE1",
    "PAPER_TABLE2",
    "PAPER_TABLE3",
    "WERNER_SYNTHETIC",
    "REPRODUCED",
    "BETTER",
    "WORSE",
    "DIFFERENT",
    "PROTOCOL_RATIO",
    "verdict",
]

#: Yue & Kontar, Table 1, verbatim: RMSE mean and std over 30 repeats on the standardised HF scale.
PAPER_TABLE1 = pd.DataFrame(
    [
        ("currin", "40/0/200", 0.148, 0.056, 0.301, 0.080, 0.295, 0.052, 0.252, 0.064),
        ("park", "50/0/300", 0.012, 0.002, 0.052, 0.006, 0.035, 0.001, 0.013, 0.001),
        ("branin", "20/40/200", 0.260, 0.065, 0.374, 0.089, 0.335, 0.070, 0.213, 0.085),
        ("hartmann3", "50/100/200", 0.365, 0.074, 0.456, 0.087, 0.412, 0.067, 0.383, 0.092),
        ("borehole", "50/0/200", 0.604, 0.006, 0.633, 0.006, 0.615, 0.005, 0.622, 0.007),
    ],
    columns=[
        "function",
        "sizes",
        "FGPR_mean",
        "FGPR_std",
        "Separate_mean",
        "Separate_std",
        "AR_mean",
        "AR_std",
        "Deep_mean",
        "Deep_std",
    ],
)

#: Yue & Kontar, Table 2: mean over 30 repeats (and, in brackets there, the std over repeats) of
#: the averaged per-engine RMSE ×10 and of the std of the per-engine RMSE ×10.
PAPER_TABLE2 = pd.DataFrame(
    [
        ("s2", "FGPR", 5.45, 0.01, 0.87, 0.02),
        ("s2", "Polynomial", 6.79, 0.01, 0.98, 0.02),
        ("s2", "Neural", 6.47, 0.05, 1.02, 0.01),
        ("s7", "FGPR", 5.76, 0.03, 0.76, 0.01),
        ("s7", "Polynomial", 6.55, 0.02, 0.89, 0.04),
        ("s7", "Neural", 6.71, 0.02, 0.85, 0.03),
    ],
    columns=["sensor", "method", "rmse_mean_x10", "rmse_mean_x10_sd", "rmse_std_x10", "rmse_std_x10_sd"],
)

#: Yue & Kontar, Table 3 (paper protocol, random partition): averaged per-device RMSE ×10 and std
#: of the per-device RMSE ×10, each with the std over 30 repeats (the paper's brackets).
PAPER_TABLE3 = pd.DataFrame(
    [
        (1, "FGPR", 2.75, 0.00, 1.84, 0.01),
        (3, "FGPR", 2.42, 0.03, 1.57, 0.01),
        (5, "FGPR", 2.20, 0.05, 1.29, 0.02),
        (7, "FGPR", 2.38, 0.01, 1.44, 0.02),
        (1, "Ditto", 3.01, 0.01, 1.70, 0.00),
        (3, "Ditto", 3.05, 0.06, 2.11, 0.02),
        (5, "Ditto", 2.89, 0.09, 1.37, 0.02),
        (7, "Ditto", 2.90, 0.02, 1.50, 0.01),
    ],
    columns=["output", "method", "rmse_mean_x10", "rmse_mean_x10_sd", "rmse_std_x10", "rmse_std_x10_sd"],
)

#: Werner et al.'s synthetic DX(4, 16, 9, 10): the authors' script (float32), seed 0, mean
#: ‖θ_i − θ*‖ at the given epoch (issue 15).
WERNER_SYNTHETIC = pd.DataFrame(
    [
        ("fc", 100, 1.76e-3),
        ("ground_truth", 100, 1.66e-3),
        ("fc", 300, 2.7e-5),
        ("ground_truth", 300, 4.9e-5),
        ("local", 100, 0.113),
        ("local", 790, 0.084),
    ],
    columns=["method", "epoch", "reference_error"],
)

#: Verdict: within the larger of the two standard deviations (:func:`verdict`).
REPRODUCED = "reproduced"
#: Verdict: beyond it, in the quantity's better direction.
BETTER = "better"
#: Verdict: beyond it, in the quantity's worse direction.
WORSE = "worse"
#: Verdict: ours and the paper's :data:`PROTOCOL_RATIO` times apart or more, either way.
DIFFERENT = "different protocol"
#: Ours and the paper's this many times apart (either way) means a different protocol, not a result.
PROTOCOL_RATIO = 3.0


def _spread(value: float | None) -> float:
    return 0.0 if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def verdict(
    ours: float,
    paper: float,
    ours_std: float | None = None,
    paper_std: float | None = None,
    tolerance: float = 0.0,
    higher_is_better: bool = False,
) -> str:
    """The verdict on one number: ``"reproduced"``, ``"better"``, ``"worse"`` or ``"different protocol"``.

    A missing (``None``/NaN) std counts as 0; ``tolerance`` is a stated absolute tolerance on the
    paper's scale for numbers printed without a spread. The ratio test applies to positive
    quantities only (an NLL can be negative, and a ratio of signed numbers means nothing).
    """
    for name, v in (("ours", ours), ("paper", paper)):
        if v is None or not math.isfinite(float(v)):
            raise InputError(f"verdict: {name}={v!r} must be a finite number")
    for name, v in (("ours_std", ours_std), ("paper_std", paper_std), ("tolerance", tolerance)):
        if _spread(v) < 0 or not math.isfinite(_spread(v)):
            raise InputError(f"verdict: {name}={v!r} must be a finite number ≥ 0 (or None for no spread)")
    ours, paper = float(ours), float(paper)
    if ours > 0 and paper > 0 and max(ours / paper, paper / ours) >= PROTOCOL_RATIO:
        return DIFFERENT
    if abs(ours - paper) <= max(_spread(paper_std), _spread(ours_std), tolerance):
        return REPRODUCED
    return BETTER if (ours > paper) == higher_is_better else WORSE
