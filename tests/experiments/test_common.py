"""What the reproductions share: the ``fedgp reproduce`` skeleton, the task cache, the papers' numbers."""

import subprocess
import sys
from dataclasses import dataclass

import pandas as pd
import pytest
import torch

from fedgp.errors import InputError
from fedgp.experiments.common import Report, TaskCache, cache_folder, reproduction, write_report
from fedgp.strategies.weighted import WeightedFGPR


def test_the_skeleton_times_the_study_and_writes_tables_then_texts(tmp_path):
    threads = torch.get_num_threads()
    seen = {}

    def study():
        seen["threads"] = torch.get_num_threads()
        return pd.DataFrame({"a": [1, 2]})

    def report(frame, minutes):
        seen["minutes"] = minutes
        return Report({"b.csv": frame, "skipped.csv": None, "a.csv": frame * 2}, {"a.md": "# a\n"})

    out = tmp_path / "new" / "folder"
    paths = reproduction(out, study, report)
    assert [p.name for p in paths] == ["b.csv", "a.csv", "a.md"]  # in the report's order, None left out
    assert not (out / "skipped.csv").exists()
    assert (out / "a.csv").read_text() == "a\n2\n4\n" and (out / "a.md").read_text() == "# a\n"
    assert seen["threads"] == 1 and seen["minutes"] >= 0
    assert torch.get_num_threads() == threads  # restored
    reproduction(tmp_path, study, report, one_thread=False)
    assert seen["threads"] == threads


def test_a_failing_study_restores_the_threads_and_writes_nothing(tmp_path):
    threads = torch.get_num_threads()

    def study():
        raise InputError("no data")

    with pytest.raises(InputError, match="no data"):
        reproduction(tmp_path, study, lambda r, m: Report({"x.csv": pd.DataFrame()}))
    assert torch.get_num_threads() == threads and list(tmp_path.iterdir()) == []
    assert write_report(tmp_path, Report({}, {"only.md": "text"})) == [tmp_path / "only.md"]


@dataclass(frozen=True)
class _Settings:
    rounds: int = 3
    engine: str | None = None
    partition_seed: int | None = None


def test_the_task_cache_keeps_tasks_and_refuses_other_settings(tmp_path):
    rows, details = pd.DataFrame({"method": ["NA", "x"], "v": [1.5, None]}), pd.DataFrame({"k": [1]})
    cache = TaskCache(tmp_path, _Settings(), seed=1)
    assert cache.load("r0") is None
    cache.save("r0", (rows, details))
    again = TaskCache(tmp_path, _Settings(engine="batched"), seed=1).load("r0")  # the engine does not count
    assert again[0]["method"].tolist() == ["NA", "x"]  # a string "NA" stays a string
    assert pd.isna(again[0]["v"].iloc[1]) and again[1]["k"].tolist() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0.csv", "r0_details.csv", "settings.txt"]
    with pytest.raises(ValueError, match="different settings or seed"):
        TaskCache(tmp_path, _Settings(), seed=2)
    with pytest.raises(ValueError, match="different settings or seed"):
        TaskCache(tmp_path, _Settings(rounds=4), seed=1)
    (tmp_path / "r1.csv").write_text("method\nx\n")  # half a task (no details): not cached
    assert cache.load("r1") is None
    with pytest.raises(ValueError, match="2 parts, got 1 frames"):
        cache.save("r2", (rows,))
    TaskCache(None, _Settings(), 0).save("r0", (rows, details))  # no folder: nothing kept


def test_a_cache_without_settings_is_named_by_its_stems(tmp_path):
    cache = TaskCache(tmp_path / "jobs", parts=("",))
    cache.save("job-abc", (pd.DataFrame({"rmse": [0.25]}),))
    assert [p.name for p in (tmp_path / "jobs").iterdir()] == ["job-abc.csv"]  # no stamp, no temp file
    assert cache.load("job-abc")[0]["rmse"].tolist() == [0.25]


def test_the_cache_folder_is_set_by_fedgp_cache_and_never_in_quick_mode(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDGP_CACHE", raising=False)
    assert cache_folder("table2", quick=False) is None
    monkeypatch.setenv("FEDGP_CACHE", str(tmp_path))
    assert cache_folder("table2", quick=False) == tmp_path / "table2"
    assert cache_folder("table2", quick=True) is None


def test_the_verdicts_read_the_papers_numbers_without_importing_the_tables():
    code = (
        "import sys, fedgp.experiments.verdicts as v, fedgp.experiments.paper as p; "
        "assert v.verdict is p.verdict; "
        "print(sorted(m for m in sys.modules if m.startswith('fedgp.experiments.table')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from fedgp.experiments import table1, table2, table3
    from fedgp.experiments.paper import PAPER_TABLE1, PAPER_TABLE2, PAPER_TABLE3

    # one copy of each paper's numbers, read by the tables too
    assert table1.PAPER_TABLE1 is PAPER_TABLE1
    assert table2.PAPER_TABLE2 is PAPER_TABLE2 and table3.PAPER_TABLE3 is PAPER_TABLE3
    assert table1.WeightedFGPR is WeightedFGPR
