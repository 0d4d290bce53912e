"""How many fedgp files the two paths everyone walks enter, and how often they move between them.

    .venv/bin/python benchmarks/trace_paths.py            # prints the counts, writes the CSV
    .venv/bin/python benchmarks/trace_paths.py --detail   # also the files, the call counts and
                                                          # the round's moves by concern

The paths (issue 50): one FGPR round of a 3-client fit on the sequential engine, with the callbacks
``fit`` adds (a :class:`fedgp.run.Run` driven as ``fit`` drives it; the second round is traced, so
first-call set-up does not count), and one ``result.predict(X, client=1)`` on the fitted result
(the second call is traced). A ``sys.setprofile`` hook sees every Python call and return; a frame
is *fedgp's* when its code lives in the package. The counts:

- ``files``: the distinct fedgp files with a frame that ran;
- ``moves``: the calls from one fedgp file into another (the innermost fedgp frame's file differs
  from the callee's): the hops a reader follows, each return back being the end of its hop;
- ``calls``: the fedgp function calls.

Calls into torch, GPyTorch or the standard library are not counted and do not break a stay in one
file. The counts are deterministic (no timing): the same commit gives the same numbers.

Writes results/benchmarks/trace_paths.csv (path, files, moves, calls, commit); ``--append`` keeps the
file's earlier rows (a before/after pair).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # trace this checkout's fedgp
OUT = ROOT / "results" / "benchmarks" / "trace_paths.csv"
PACKAGE = str(ROOT / "fedgp")


def commit() -> str:
    """The traced checkout's commit (``+changes`` when its fedgp differs from it)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "fedgp") else "")


#: Where a move happens, by the innermost of these functions on the stack (first match wins).
CONCERNS = [
    ("client: local steps", ("engines/sequential.py:train", "engines/sequential.py:_loss_and_grad")),
    ("client: the task's answer", ("engines/tasks.py:answer", "engines/tasks.py:handle")),
    ("engine: delivery, reply checks, bytes", ("engines/base.py:_run",)),
    ("server: aggregate and step", (":aggregate",)),
    ("server: plan the round", (":configure",)),
    ("callbacks", ("run/loop.py:_complete",)),
]


class Tracer:
    """Counts fedgp files entered, moves between them and calls, while active."""

    def __init__(self) -> None:
        self.files: Counter[str] = Counter()
        self.moves = 0
        self.calls = 0
        self.stack: list[str | None] = []  # per Python frame: its fedgp file, or None
        self.functions: list[str] = []  # per Python frame: file:function
        self.concerns: Counter[str] = Counter()

    def _concern(self) -> str:
        for concern, marks in CONCERNS:
            if any(f.endswith(mark) for f in self.functions for mark in marks):
                return concern
        return "other (the run loop, the exchange, the plan's records)"

    def _file(self, frame) -> str | None:
        name = frame.f_code.co_filename
        return name[len(PACKAGE) + 1 :] if name.startswith(PACKAGE) else None

    def _current(self) -> str | None:
        for name in reversed(self.stack):
            if name is not None:
                return name
        return None

    def __call__(self, frame, event, arg) -> None:
        if event == "call":
            before = self._current()
            name = self._file(frame)
            self.stack.append(name)
            if name is not None:
                self.calls += 1
                self.files[name] += 1
                if before is not None and name != before:
                    self.moves += 1
                    self.concerns[self._concern()] += 1
            self.functions.append(f"{name}:{frame.f_code.co_name}")
        elif event == "return" and self.stack:
            self.stack.pop()
            self.functions.pop()

    def __enter__(self) -> Tracer:
        sys.setprofile(self)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def federation():
    import torch

    from fedgp.data import ClientData, Federation

    g = torch.Generator().manual_seed(0)
    clients = []
    for i in range(3):
        X = torch.rand(30, 2, generator=g, dtype=torch.float64)
        y = torch.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * torch.randn(30, generator=g, dtype=torch.float64)
        clients.append(ClientData(X, y, id=f"owner-{i}"))
    return Federation(clients)


def trace() -> dict[str, Tracer]:
    import torch

    from fedgp import GPSpec
    from fedgp.run.loop import Run
    from fedgp.strategies import FGPR

    warnings.simplefilter("ignore")
    run = Run(GPSpec(), federation(), FGPR(), rounds=3, engine="sequential", callbacks=[])
    with run.engine.thread_setting():
        run.start()
        run.round()  # first calls, caches
        with Tracer() as round_trace:
            run.round()
        while not run.done:
            run.round()
        result = run.finish()
    X = torch.rand(5, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    result.predict(X, client=1)
    with Tracer() as predict_trace:
        result.predict(X, client=1)
    return {"round": round_trace, "predict": predict_trace}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--detail", action="store_true", help="list the files and their call counts")
    parser.add_argument("--append", action="store_true", help="keep the CSV's earlier rows")
    args = parser.parse_args()
    traces = trace()
    rows = []
    for path, t in traces.items():
        rows.append(
            {"path": path, "files": len(t.files), "moves": t.moves, "calls": t.calls, "commit": commit()}
        )
        print(f"{path:8s} files {len(t.files):3d}  moves {t.moves:4d}  calls {t.calls:5d}")
        if args.detail:
            for name, count in t.files.most_common():
                print(f"    {count:5d}  {name}")
            print("  moves by concern:")
            for concern, count in t.concerns.most_common():
                print(f"    {count:5d}  {concern}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    earlier = list(csv.DictReader(OUT.open())) if args.append and OUT.exists() else []
    with OUT.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["path", "files", "moves", "calls", "commit"])
        writer.writeheader()
        writer.writerows(earlier + rows)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
