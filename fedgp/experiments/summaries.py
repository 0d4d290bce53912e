"""Per-client metrics of repeated runs, summarised as the FGPR paper's Tables 2 and 3 are.

Both tables report, per method, the mean over repeats of (a) the mean and (b) the standard
deviation across clients of the per-client RMSE, ×10; the paper's bracketed numbers are the
standard deviations of (a) and (b) over repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from fedgp.experiments.common import Report
from fedgp.experiments.paper import verdict

__all__ = ["per_repeat", "over_repeats_x10", "PaperTable", "TableRun"]


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


@dataclass(frozen=True)
class PaperTable:
    """How one of the paper's tables is keyed, ordered, written and set beside the paper's numbers.

    ``keys``: the row labels, ``"method"`` last; ``count``: the name of the per-repeat client count;
    ``categories``: the fixed order of some labels; ``sort_by``: the row order; ``columns``: the CSV's;
    ``paper``: the paper's numbers (labels first, then its four RMSE columns), joined on ``paper_on``
    after adding the constant labels ``paper_fixed``.
    """

    keys: tuple[str, ...]
    count: str
    categories: dict[str, tuple[str, ...]]
    sort_by: tuple[str, ...]
    columns: tuple[str, ...]
    paper: pd.DataFrame
    paper_on: tuple[str, ...]
    paper_fixed: dict[str, str] = field(default_factory=dict)

    def per_repeat(self, per_client: pd.DataFrame) -> pd.DataFrame:
        """Per-client rows averaged into one row per repeat, as the paper reports."""
        return per_repeat(per_client, self.keys, self.count)

    def order(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Rows sorted in the paper's order of its row and column labels."""
        frame = frame.copy()
        for column, values in self.categories.items():
            frame[column] = pd.Categorical(frame[column], categories=list(values), ordered=True)
        frame = frame.sort_values(list(self.sort_by)).reset_index(drop=True)
        return frame.astype({column: str for column in self.categories})

    def summary(self, per_client: pd.DataFrame) -> pd.DataFrame:
        """Means over repeats of the per-repeat mean and std (across clients) of the per-client RMSE
        ×10, mean NLL and mean 95% coverage: the CSV."""
        return self.order(over_repeats_x10(self.per_repeat(per_client), self.keys))[list(self.columns)]

    def comparison(self, per_client: pd.DataFrame) -> pd.DataFrame:
        """Ours, with the std over repeats, beside the paper's numbers where the paper has them."""
        return self.comparison_of_repeats(self.per_repeat(per_client))

    def comparison_of_repeats(self, per_repeat: pd.DataFrame) -> pd.DataFrame:
        """:meth:`comparison` from :meth:`per_repeat`'s rows (the committed ``*_per_repeat.csv``)."""
        ours = over_repeats_x10(per_repeat, self.keys, spread=True)
        paper = self.paper.rename(columns={c: f"paper_{c}" for c in self.paper.columns[2:]})
        paper = paper.assign(**self.paper_fixed)
        return self.order(ours.merge(paper, on=list(self.paper_on), how="left"))

    def markdown(self, per_client: pd.DataFrame) -> str:
        """The comparison as a markdown table: ours (std over repeats) | the paper's | the verdict
        (:func:`fedgp.experiments.paper.verdict` on the RMSE)."""
        return self.markdown_of_repeats(self.per_repeat(per_client))

    def markdown_of_repeats(self, per_repeat: pd.DataFrame) -> str:
        """:meth:`markdown` from :meth:`per_repeat`'s rows (the committed ``*_per_repeat.csv``)."""

        def cell(mean, sd):
            return f"{mean:.2f}" + ("" if np.isnan(sd) else f" ({sd:.2f})")

        def paper(r, name):
            mean = r[f"paper_{name}"]
            return "—" if np.isnan(mean) else cell(mean, r[f"paper_{name}_sd"])

        labels = " | ".join(self.keys)
        lines = [
            f"| {labels} | RMSE×10 ours | RMSE×10 paper | std RMSE×10 ours | std RMSE×10 paper "
            "| NLL | 95% cov. | repeats | verdict on RMSE |",
            "|" + "---|" * (len(self.keys) + 8),
        ]
        for _, r in self.comparison_of_repeats(per_repeat).iterrows():
            theirs = r["paper_rmse_mean_x10"]
            judged = (
                "—"
                if np.isnan(theirs)
                else verdict(r["rmse_mean_x10"], theirs, r["rmse_mean_x10_sd"], r["paper_rmse_mean_x10_sd"])
            )
            lines.append(
                "| "
                + " | ".join(str(r[k]) for k in self.keys)
                + f" | {cell(r['rmse_mean_x10'], r['rmse_mean_x10_sd'])} | {paper(r, 'rmse_mean_x10')} "
                f"| {cell(r['rmse_std_x10'], r['rmse_std_x10_sd'])} | {paper(r, 'rmse_std_x10')} "
                f"| {r['nll_mean']:.3f} | {r['coverage95_mean']:.3f} | {int(r['repeats'])} | {judged} |"
            )
        return "\n".join(lines) + "\n"


@dataclass
class TableRun:
    """A run of one of the tables: its per-client ``rows``, per-task ``details`` and ``settings``,
    and the views of the rows that its ``table`` defines."""

    rows: pd.DataFrame
    details: pd.DataFrame
    settings: Any
    table: ClassVar[PaperTable]

    @property
    def per_repeat(self) -> pd.DataFrame:
        """This run's per-repeat table."""
        return self.table.per_repeat(self.rows)

    def summary(self) -> pd.DataFrame:
        """This run's summary: mean and std over repeats per row."""
        return self.table.summary(self.rows)

    def comparison(self) -> pd.DataFrame:
        """This run's summary beside the paper's numbers."""
        return self.table.comparison(self.rows)

    def report(self, name: str, header: str) -> Report:
        """``{name}.csv`` (the summary), ``{name}_per_repeat.csv``, ``{name}_details.csv`` and
        ``{name}.md`` (``header`` and the comparison): what ``fedgp reproduce`` writes of this run."""
        tables = {
            f"{name}.csv": self.summary(),
            f"{name}_per_repeat.csv": self.per_repeat,
            f"{name}_details.csv": self.details,
        }
        return Report(tables, {f"{name}.md": header + self.table.markdown(self.rows)})
