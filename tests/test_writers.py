"""Writers that never collide (issue 51, item 6): ``fedgp fit``/``predict`` claim ``--out`` with an
exclusive create of a marker before writing; a second writer at the same time is refused in one
line, a killed writer's marker is named and ``--force`` takes it over."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from fedgp.cli import main
from fedgp.commands import WRITER_MARKER, _marker_text
from tests.test_cli import owners_frame

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
FIT_FILES = {"model.fedgp", "history.csv", "transforms.json", "metrics.csv", "failures.csv", "columns.json"}


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    code = "import sys; from fedgp.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _race(argvs: list[list[str]], cwd: Path) -> list[tuple[int, str]]:
    procs = [_start(argv, cwd) for argv in argvs]
    done = []
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        done.append((proc.returncode, err))
    return done


def _fit_argv(data: Path, out: Path, rounds: str) -> list[str]:
    return ["fit", str(data), "--target", "y", "--group", "owner", "--rounds", rounds, "--stop", "none",
            "--quiet", "--out", str(out)]  # fmt: skip


def _check_one_won(done: list[tuple[int, str]], out: Path) -> int:
    codes = [code for code, _ in done]
    assert codes.count(0) == 1, done
    for code, err in done:
        if code != 0:
            assert code == 2 and "Traceback" not in err, err
            refusal = [line for line in err.splitlines() if line.strip()]
            assert len(refusal) == 1, err
            assert str(out) in refusal[0] and (
                "being written by another fedgp process (pid " in refusal[0]
                or "already holds" in refusal[0]  # the winner had finished before this one started
            ), refusal[0]
    assert not (out / WRITER_MARKER).exists()
    return codes.index(0)


def test_three_fits_to_one_new_out_one_wins_and_the_others_refuse(tmp_path):
    data = tmp_path / "data.csv"
    owners_frame().to_csv(data, index=False)
    out = tmp_path / "m"
    # different round counts: the history tells which run's files the folder holds
    done = _race([_fit_argv(data, out, r) for r in ("40", "41", "42")], tmp_path)
    winner = _check_one_won(done, out)
    assert {p.name for p in out.iterdir()} == FIT_FILES
    assert len(pd.read_csv(out / "history.csv")) == 40 + winner


def test_two_predicts_to_one_out_one_wins_and_the_other_refuses(tmp_path):
    data = tmp_path / "data.csv"
    owners_frame().to_csv(data, index=False)
    assert main(_fit_argv(data, tmp_path / "m", "3")) == 0
    frame = owners_frame(sizes=(400, 400, 400), seed=1).drop(columns="y")
    frame.to_csv(tmp_path / "new.csv", index=False)
    out = tmp_path / "p"
    predict = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(data), "--quiet"]
    done = _race([[*predict, "--out", str(out)] for _ in range(2)], tmp_path)
    _check_one_won(done, out)
    assert {p.name for p in out.iterdir()} == {"predictions.csv"}
    assert len(pd.read_csv(out / "predictions.csv")) == 1200


def test_a_live_writers_marker_refuses_even_with_force(tmp_path, capsys):
    data = tmp_path / "data.csv"
    owners_frame().to_csv(data, index=False)
    out = tmp_path / "m"
    out.mkdir()
    (out / WRITER_MARKER).write_text(_marker_text())  # this very process: alive
    for extra in ([], ["--force"]):
        assert main([*_fit_argv(data, out, "3"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"--out {out} is being written by another fedgp process (pid {os.getpid()}" in err
    assert [p.name for p in out.iterdir()] == [WRITER_MARKER]


def test_a_killed_writers_marker_is_named_and_force_takes_it_over(tmp_path, capsys):
    data = tmp_path / "data.csv"
    owners_frame().to_csv(data, index=False)
    out = tmp_path / "m"
    # a real writer killed mid-run (SIGKILL: no clean-up) leaves its marker behind
    proc = _start(_fit_argv(data, out, "100000"), tmp_path)
    try:
        for _ in range(600):
            if (out / WRITER_MARKER).exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert (out / WRITER_MARKER).exists()
        pid = json.loads((out / WRITER_MARKER).read_text())["pid"]
        assert pid == proc.pid
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert main(_fit_argv(data, out, "3")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert (
        f"--out {out} holds {WRITER_MARKER} from a fedgp writer that is no longer running (pid {pid}" in err
    )
    assert "pass --force" in err
    assert main([*_fit_argv(data, out, "3"), "--force"]) == 0
    assert {p.name for p in out.iterdir()} == FIT_FILES
    assert len(pd.read_csv(out / "history.csv")) == 3


def test_demo_and_reproduce_claim_out_too(tmp_path, capsys):
    """A demo or a reproduction into a folder another fedgp process is writing is refused in one line
    before any work, and leaves that process's marker alone."""
    out = tmp_path / "busy"
    out.mkdir()
    (out / WRITER_MARKER).write_text(_marker_text())  # this very process: alive
    for argv in (["demo", "--quick", "--quiet"], ["reproduce", "verdicts", "--quiet"]):
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert f"--out {out} is being written by another fedgp process (pid {os.getpid()}" in err
    assert [p.name for p in out.iterdir()] == [WRITER_MARKER]
