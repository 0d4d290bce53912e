"""Table 1's report: our numbers beside the paper's, who wins, and ``table1.md``."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import pandas as pd

from fedgp.experiments.metrics import markdown_table
from fedgp.experiments.paper import PAPER_TABLE1, verdict
from fedgp.experiments.table1.protocol import SWEEP_METHODS, Protocol

__all__ = ["compare_with_paper", "winners", "FEDERATED", "markdown", "functions_markdown"]

#: The federated methods, each set against every other method in :func:`winners`.
FEDERATED: tuple[str, ...] = ("FGPR", "FGPR-converged")

#: Our methods beside the paper's columns (``None``: the paper has no such method).
_PAIRS = [
    ("FGPR", "FGPR"),
    ("FGPR", "FGPR-converged"),
    ("Separate", "Separate"),
    (None, "SeparateMLE"),
    (None, "FGPR-MLE"),
    ("AR", "AR1"),
    ("Deep", "MF-DGP"),
    ("Deep", "NARGP"),
]

_table = partial(markdown_table, floatfmt=".4f")


def compare_with_paper(summary: pd.DataFrame) -> pd.DataFrame:
    """Our RMSE beside the paper's, one row per function (``mean ± std`` strings).

    Paper columns: FGPR, Separate, AR, Deep. Ours: every method in ``summary``; ``FGPR-converged``
    is set against the paper's FGPR, ``AR1`` the paper's AR, and ``MF-DGP`` (the paper's Deep) and
    ``NARGP`` (a different nonlinear model) the paper's Deep.
    ``<method> verdict``: :func:`fedgp.experiments.paper.verdict` on our mean against the paper's
    (reproduced within the larger std, better/worse beyond it, "different protocol" at a 3× ratio).
    """
    mean = summary.pivot(index="function", columns="method", values="rmse_mean")
    std = summary.pivot(index="function", columns="method", values="rmse_std")
    rows = []
    for _, paper in PAPER_TABLE1.iterrows():
        f = paper["function"]
        if f not in mean.index:
            continue
        row = {"function": f, "HF/MF/LF": paper["sizes"]}
        for theirs, ours in _PAIRS:
            if theirs is not None and f"paper {theirs}" not in row:
                row[f"paper {theirs}"] = f"{paper[f'{theirs}_mean']:.3f} ± {paper[f'{theirs}_std']:.3f}"
            if ours in mean.columns:
                ran = pd.notna(mean.loc[f, ours])  # a method run on some functions only: "—" elsewhere
                row[f"ours {ours}"] = f"{mean.loc[f, ours]:.3f} ± {std.loc[f, ours]:.3f}" if ran else "—"
        for theirs, ours in _PAIRS:
            if theirs is not None and ours in mean.columns:
                if pd.isna(mean.loc[f, ours]):
                    row[f"{ours} verdict"] = "—"
                    continue
                row[f"{ours} verdict"] = verdict(
                    mean.loc[f, ours], paper[f"{theirs}_mean"], std.loc[f, ours], paper[f"{theirs}_std"]
                )
        rows.append(row)
    return pd.DataFrame(rows)


def winners(summary: pd.DataFrame) -> pd.DataFrame:
    """For each function: which of FGPR (and FGPR-converged) and each other method has the lower
    mean RMSE."""
    mean = summary.pivot(index="function", columns="method", values="rmse_mean")
    order = [f for f in PAPER_TABLE1["function"] if f in mean.index] + [
        f for f in mean.index if f not in set(PAPER_TABLE1["function"])
    ]
    rows = []
    for f in order:
        row = {"function": f}
        for ours in (m for m in FEDERATED if m in mean.columns):
            for m in mean.columns:
                if m in FEDERATED:
                    continue
                if pd.isna(mean.loc[f, m]):  # a method not run on this function
                    row[f"{ours} vs {m}"] = "—"
                    continue
                row[f"{ours} vs {m}"] = ours if mean.loc[f, ours] < mean.loc[f, m] else m
        row["best"] = mean.loc[f].idxmin()
        rows.append(row)
    return pd.DataFrame(rows)


def _paired_wins(runs: pd.DataFrame, by: Sequence[str], baseline: str, ours: str = "FGPR") -> pd.DataFrame:
    """How many repeats ``ours``'s RMSE is below ``baseline``'s (same data, same seed)."""
    keys = [*by, "seed"]
    wide = runs.pivot_table(index=keys, columns="method", values="rmse").reset_index()
    wide["win"] = wide[ours] < wide[baseline]
    return wide.groupby(list(by)).agg(wins=("win", "sum"), repeats=("win", "size")).reset_index()


def _convergence_text(runs: pd.DataFrame) -> str:
    """FGPR-converged's rounds and how many runs met the rule, per function (and HF size)."""
    if "converged" not in runs or "FGPR-converged" not in set(runs["method"]):
        return "no FGPR-converged runs"
    rows = runs[runs["method"] == "FGPR-converged"]
    parts = []
    for (f, n), g in rows.groupby(["function", "hf_size"], sort=False):
        met = int(g["converged"].astype(str).str.lower().eq("true").sum())
        parts.append(
            f"{f} (HF {n}) median {g['rounds'].median():.0f} rounds [{g['rounds'].min():.0f}–"
            f"{g['rounds'].max():.0f}], rule met {met}/{len(g)}"
        )
    return "FGPR-converged: " + "; ".join(parts)


def _table_lines(summary: pd.DataFrame, runs: pd.DataFrame, sweep_runs: pd.DataFrame | None) -> list[str]:
    """Table 1 beside the paper, the winners, every method, the paired wins, convergence and failures."""
    lines = ["## Table 1: ours beside the paper's (RMSE mean ± std over repeats, standardised HF scale)", ""]
    lines += [_table(compare_with_paper(summary)), ""]
    lines += ["Which wins (lower mean RMSE):", "", _table(winners(summary)), ""]
    lines += ["## Table 1: every method, with calibration", ""]
    lines += [_table(summary), ""]
    methods = set(runs["method"])
    for ours in (m for m in FEDERATED if m in methods):
        for base in ("FGPR", "Separate", "SeparateMLE", "FGPR-MLE", "AR1", "NARGP", "MF-DGP"):
            if base in methods and base != ours and not (ours == "FGPR" and base == "FGPR-MLE"):
                wins = _paired_wins(runs, ["function"], base, ours)
                text = ", ".join(f"{r.function} {r.wins}/{r.repeats}" for r in wins.itertuples())
                lines.append(f"- {ours}'s RMSE below {base}'s (paired, same data): {text}")
    parts = [("Table 1", runs)] + ([] if sweep_runs is None else [("sweep", sweep_runs)])
    for name, frame in parts:
        lines.append(f"- {name}: {_convergence_text(frame)}")
    for name, frame in parts:
        failed = frame[frame["error"].fillna("").astype(str) != ""] if "error" in frame else frame.iloc[:0]
        lines.append(
            f"- Failed fits ({name}): {len(failed)}"
            + "".join(f"\n  - {r.function} {r.method} seed {r.seed}: {r.error}" for r in failed.itertuples())
        )
    return lines


def _sweep_lines(sweep: pd.DataFrame, sweep_runs: pd.DataFrame) -> list[str]:
    """The sweep's table: RMSE mean ± std per function and HF size, paired wins vs SeparateMLE."""
    table = sweep.pivot(index=["function", "hf_size"], columns="method", values="rmse_mean")
    table_std = sweep.pivot(index=["function", "hf_size"], columns="method", values="rmse_std")
    shown = table.copy().astype(object)
    for c in table.columns:
        shown[c] = [f"{m:.3f} ± {s:.3f}" for m, s in zip(table[c], table_std[c])]
    for ours in (m for m in FEDERATED if m in table.columns):
        if "SeparateMLE" in table.columns:
            wins = _paired_wins(sweep_runs, ["function", "hf_size"], "SeparateMLE", ours).set_index(
                ["function", "hf_size"]
            )
            shown[f"{ours} paired wins vs SeparateMLE"] = [
                f"{w}/{n}" for w, n in zip(wins["wins"], wins["repeats"])
            ]
    return [_table(shown.reset_index()), ""]


def markdown(
    summary: pd.DataFrame,
    runs: pd.DataFrame,
    sweep: pd.DataFrame | None,
    sweep_runs: pd.DataFrame | None,
    ablation: pd.DataFrame,
    choices: pd.DataFrame,
    protocol: Protocol,
    header: str,
) -> str:
    """``table1.md``: ``header``, Table 1 beside the paper, the sweep (``None``: not run), the p₁
    ablation, the protocol choices and the protocol."""
    lines = [header, "", *_table_lines(summary, runs, sweep_runs)]
    lines += ["", "## HF-size sweep (beyond the paper)", ""]
    if sweep is None:
        lines += [f"Not run: `--methods` names none of its methods ({', '.join(SWEEP_METHODS)}).", ""]
    else:
        lines += _sweep_lines(sweep, sweep_runs)
    lines += ["## Fig. 9 ablation: FGPR on CURRIN with the HF weight p₁ forced", ""]
    lines += [_table(ablation), ""]
    n = int(choices["repeats"].min())
    lines += [f"## Protocol choices: FGPR with uniform/nearest minibatches × ARD/isotropic ({n} repeats)", ""]
    wide = choices.copy()
    wide["variant"] = choices["minibatch"] + np.where(choices["ard"], " + ARD", " + isotropic")
    lines += [
        _table(wide.pivot(index="function", columns="variant", values="rmse_mean").reset_index()),
        "",
    ]
    lines += ["## Protocol", "", "```", repr(protocol), "```", ""]
    return "\n".join(lines)


def functions_markdown(
    summary: pd.DataFrame, functions: Sequence, repeats: int, seed: int, quick: bool, protocol: Protocol
) -> str:
    """``table1_<names>.md``: Table 1's methods on functions the paper has no numbers for."""
    lines = [
        f"# Table 1's methods on {', '.join(repr(f) for f in functions)} ({repeats} repeats, seed {seed}"
        f"{', QUICK MODE' if quick else ''})",
        "",
        "RMSE mean ± std over repeats on the standardised HF scale; sizes per level (lowest first): "
        + "; ".join(f"{f.name} {list(f.paper_sizes)}" for f in functions)
        + ". The paper has no numbers for these settings.",
        "",
        _table(summary),
        "",
        "Which wins (lower mean RMSE):",
        "",
        _table(winners(summary)),
        "",
        "## Protocol",
        "",
        "```",
        repr(protocol),
        "```",
        "",
    ]
    return "\n".join(lines)
