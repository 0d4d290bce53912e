"""The verdict rule, and the at-a-glance block of results/README.md generated from the committed CSVs."""

import io
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedgp.experiments.registry import get_reproduction
from fedgp.experiments.verdicts import (
    BEGIN,
    BETTER,
    DIFFERENT,
    END,
    REPRODUCED,
    WORSE,
    collect,
    markdown,
    reproduce,
    update_readme,
    verdict,
)

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_within_the_larger_spread_is_reproduced():
    assert verdict(0.100, 0.148, ours_std=0.040, paper_std=0.056) == REPRODUCED  # 0.048 ≤ 0.056
    assert verdict(0.393, 0.260, ours_std=0.211, paper_std=0.065) == REPRODUCED  # ours is the wider
    assert verdict(1.02, 1.0, tolerance=0.05) == REPRODUCED  # no spreads: the stated tolerance
    assert verdict(1.0, 1.0) == REPRODUCED


def test_beyond_the_spread_the_direction_decides():
    # lower is better (RMSE, errors)
    assert verdict(6.75, 5.45, ours_std=0.09, paper_std=0.01) == WORSE
    assert verdict(5.48, 5.76, ours_std=0.12, paper_std=0.03) == BETTER
    # higher is better (accuracy): the same numbers, the other way round
    assert verdict(0.9, 0.8, paper_std=0.01, higher_is_better=True) == BETTER
    assert verdict(0.8, 0.9, paper_std=0.01, higher_is_better=True) == WORSE
    assert verdict(0.8, 0.9, paper_std=0.01) == BETTER


def test_a_threefold_gap_is_a_different_protocol_however_wide_the_spread():
    # Borehole: our 0.054 against the paper's 0.604 is 11x lower; not a success
    assert verdict(0.054, 0.604, ours_std=0.023, paper_std=0.006) == DIFFERENT
    assert verdict(0.054, 0.604, ours_std=10.0, paper_std=10.0) == DIFFERENT
    assert verdict(3.0, 1.0) == DIFFERENT  # either way, from exactly 3x
    assert verdict(1.0, 3.0) == DIFFERENT
    assert verdict(2.99, 1.0, ours_std=5.0) == REPRODUCED
    # no ratio for signed quantities (an NLL): only the spread decides
    assert verdict(-3.0, -1.0, ours_std=0.1) == BETTER
    assert verdict(-1.05, 0.02, paper_std=2.0) == REPRODUCED


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ours": float("nan"), "paper": 1.0}, "ours"),
        ({"ours": 1.0, "paper": None}, "paper"),
        ({"ours": 1.0, "paper": 1.0, "ours_std": -0.1}, "ours_std"),
        ({"ours": 1.0, "paper": 1.0, "tolerance": float("inf")}, "tolerance"),
    ],
)
def test_bad_numbers_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        verdict(**kwargs)


def _block(readme: str) -> str:
    return readme.split(BEGIN + "\n", 1)[1].split(END, 1)[0]


def test_the_committed_block_and_csv_are_what_the_generator_writes():
    """If this fails, a CSV changed: run `fedgp reproduce verdicts --out results` and commit."""
    readme = (RESULTS / "README.md").read_text()
    table = collect(RESULTS)
    assert _block(readme) == markdown(table, readme, RESULTS)
    committed = pd.read_csv(RESULTS / "verdicts.csv")
    pd.testing.assert_frame_equal(committed, pd.read_csv(io.StringIO(table.to_csv(index=False))))
    assert (RESULTS / "verdicts.md").read_text() == markdown(table, readme, RESULTS)


def test_every_link_of_the_block_is_a_heading_of_the_readme():
    readme = (RESULTS / "README.md").read_text()
    anchors = set(re.findall(r"\]\((#[^)]*)\)", _block(readme)))
    assert anchors and "#" not in anchors
    slugs = {
        "#" + re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in readme.splitlines()
        if line.startswith("#")
    }
    assert anchors <= slugs


def test_the_committed_numbers_get_the_rule():
    table = collect(RESULTS).set_index(["source", "quantity", "method"])
    borehole = table.loc[("Table 1", "RMSE, Borehole", "FGPR")]
    assert borehole["verdict"] == DIFFERENT and borehole["ratio"] < 1 / 3
    assert table.loc[("Table 2", "RMSE×10, sensor s2", "FGPR"), "verdict"] == WORSE
    assert table.loc[("Table 2", "RMSE×10, sensor s7", "FGPR"), "verdict"] == BETTER
    for _, r in table.reset_index().iterrows():
        assert r["verdict"] == verdict(
            r["ours"], r["paper_value"], r["ours_std"], r["paper_std"], r["tolerance"]
        )


def test_methods_added_to_table1_later_are_picked_up(tmp_path):
    for name in ("table1.csv", "table2_per_repeat.csv"):
        shutil.copy(RESULTS / name, tmp_path / name)
    t1 = pd.read_csv(tmp_path / "table1.csv")
    t1 = t1[~t1["method"].isin(["FGPR-converged", "MF-DGP"])]  # the committed file may hold them already
    extra = []
    for method, scale in (("FGPR-converged", 0.9), ("MF-DGP", 1.1), ("SomethingNew", 1.0)):
        rows = t1[t1["method"] == "FGPR"].copy()
        rows["method"] = method
        rows["rmse_mean"] *= scale
        extra.append(rows)
    pd.concat([t1, *extra]).to_csv(tmp_path / "table1.csv", index=False)
    table = collect(tmp_path)
    t1_rows = table[table["source"] == "Table 1"]
    assert set(t1_rows["method"]) == {"FGPR", "FGPR-converged", "Separate", "AR1", "MF-DGP"}
    deep = t1_rows[t1_rows["paper_method"] == "Deep"]
    assert set(deep["method"]) == {"MF-DGP"}  # NARGP stood in only while there was no MF-DGP
    headline = table[table["headline"]]
    assert set(headline["method"]) == {"FGPR", "FGPR-converged"}
    block = markdown(table, "", tmp_path)
    assert block.count("| FGPR-converged |") == 5
    assert "Not run yet (no CSV): `table3_per_repeat.csv`, `werner_synthetic.csv`." in block
    converged = headline[headline["method"] == "FGPR-converged"].iloc[0]
    assert np.isclose(
        converged["ours"], 0.9 * t1.set_index(["function", "method"]).loc[("currin", "FGPR"), "rmse_mean"]
    )


def test_reproduce_rewrites_only_the_marked_block(tmp_path):
    shutil.copy(RESULTS / "table2_per_repeat.csv", tmp_path)
    readme = f"# results\n\n## Table 2 — here\n\nbefore\n{BEGIN}\nstale\n{END}\nafter\n"
    (tmp_path / "README.md").write_text(readme)
    paths = get_reproduction("verdicts")(None, tmp_path, 0, False, False)
    assert {p.name for p in paths} == {"verdicts.csv", "verdicts.md", "README.md"}
    text = (tmp_path / "README.md").read_text()
    assert (
        "stale" not in text
        and text.startswith("# results\n\n## Table 2 — here\n\nbefore\n")
        and text.endswith("after\n")
    )
    assert "[Table 2](#table-2--here)" in text
    # a second run changes nothing
    reproduce(None, tmp_path, 0, False, False)
    assert (tmp_path / "README.md").read_text() == text


def test_a_malformed_readme_or_an_empty_folder_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="verdicts:begin"):
        update_readme(f"{BEGIN}\n{BEGIN}\n{END}\n", "x")
    with pytest.raises(ValueError, match="verdicts:end"):
        update_readme(f"{END}\n{BEGIN}\n", "x")
    with pytest.raises(FileNotFoundError, match="table1.csv"):
        collect(tmp_path)


@pytest.mark.parametrize("name", ["table2", "table3"])
def test_the_committed_table_markdown_carries_the_rule(name):
    """table2.md / table3.md: their comparison, verdict column included, is what the committed
    per-repeat rows give (the rest of each file is the run's header)."""
    import importlib

    table = importlib.import_module(f"fedgp.experiments.{name}").TABLE
    per_repeat = pd.read_csv(RESULTS / f"{name}_per_repeat.csv")
    expected = table.markdown_of_repeats(per_repeat)
    assert (RESULTS / f"{name}.md").read_text().endswith(expected)
    rows = {tuple(line.split(" | ")[:2]): line.rsplit(" | ", 1)[1] for line in expected.splitlines()[2:]}
    if name == "table2":
        assert rows[("| s2", "FGPR")] == "worse |" and rows[("| s7", "FGPR")] == "better |"
        assert rows[("| s2", "LocalGP")] == "— |"  # no paper number, no verdict


def test_the_committed_table1_markdown_carries_the_rule():
    from fedgp.experiments.metrics import markdown_table
    from fedgp.experiments.table1 import compare_with_paper

    text = (RESULTS / "table1.md").read_text()
    assert markdown_table(compare_with_paper(pd.read_csv(RESULTS / "table1.csv")), ".4f") in text
    assert "paper + 1 std" not in text
