"""Progress without a terminal: whole lines every tenth of a loop, throttled; a bar or nothing otherwise."""

import io

import pytest
from tqdm import tqdm

import fedgp
import fedgp.run.progress
from fedgp.run.progress import LineProgress, progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def counts(text: str, desc: str = "loop") -> list[int]:
    return [int(line.split(": ")[1].split("/")[0]) for line in text.splitlines() if line.startswith(desc)]


def test_a_line_every_tenth_and_the_last(monkeypatch):
    monkeypatch.setattr(fedgp.run.progress, "MIN_SECONDS", 0.0)
    out = io.StringIO()
    for _ in progress_bar(range(25), progress=True, desc="loop", file=out):
        pass
    assert counts(out.getvalue()) == [3, 6, 9, 12, 15, 18, 21, 24, 25]
    assert "\r" not in out.getvalue() and out.getvalue().endswith("\n")


def test_every_initial_and_an_unknown_total():
    out = io.StringIO()
    bar = LineProgress(range(5, 25), desc="loop", total=25, initial=5, file=out, min_seconds=0, every=7)
    for _ in bar:
        pass
    assert counts(out.getvalue()) == [7, 14, 21, 25]  # a resumed loop does not report its start
    out = io.StringIO()
    for _ in LineProgress(iter(range(3)), desc="loop", file=out, min_seconds=0):
        pass
    assert counts(out.getvalue().replace(" [", "/ [")) == [1, 2, 3]
    with pytest.raises(ValueError, match="every must be a positive int"):
        LineProgress(range(3), desc="x", file=io.StringIO(), every=0)


def test_lines_are_throttled_and_short_loops_stay_quiet():
    out = io.StringIO()
    for _ in LineProgress(range(100), desc="loop", file=out, min_seconds=3600):
        pass
    assert out.getvalue() == ""  # neither a line on the way nor a closing one


def test_terminal_gets_tqdms_bar_and_false_none_behave_as_before():
    term = Terminal()
    bar = progress_bar(range(3), progress=True, desc="loop", file=term)
    assert type(bar) is tqdm and not bar.disable
    bar.close()
    assert progress_bar(range(3), progress=None, desc="loop", file=io.StringIO()).disable  # no terminal
    assert progress_bar(range(3), progress=False, desc="loop", file=term).disable
    assert isinstance(progress_bar(range(3), progress=True, desc="loop", file=io.StringIO()), LineProgress)


def test_fit_reports_rounds_and_train_nll(monkeypatch, capsys):
    monkeypatch.setattr(fedgp.run.progress, "MIN_SECONDS", 0.0)
    draws = fedgp.synthetic.gp_federation(num_clients=3, n=12, d=1, seed=0)
    fedgp.fit(
        draws.spec,
        draws.federation,
        fedgp.strategies.FGPR(batch_size=8),
        rounds=10,
        callbacks=[fedgp.run.Progress(True)],
    )
    lines = capsys.readouterr().err.splitlines()
    assert counts("\n".join(lines), "FGPR") == list(range(1, 11)) and all("train_nll=" in x for x in lines)
    # The default Progress() shows a bar only on a terminal, and Progress(False) never: nothing here.
    for callbacks in ((), [fedgp.run.Progress(False)]):
        fedgp.fit(
            draws.spec, draws.federation, fedgp.strategies.FGPR(batch_size=8), rounds=3, callbacks=callbacks
        )
        assert capsys.readouterr().err == ""
