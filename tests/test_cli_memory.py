"""``fedgp fit`` under a memory limit: running out ends in one line on stderr and exit status 3, never
a traceback (issue 51, item 7), whether the limit is too small for the data or for the libraries."""

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedgp._cli_memory import OUT_OF_MEMORY, out_of_memory
from fedgp.cli import main

REPO = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS as Linux enforces it")


def _fit_under_limit(data: Path, out: Path, gib: float):
    """``fedgp fit DATA`` in a fresh process whose address space is capped at ``gib`` GiB."""
    import resource
    import subprocess

    def cap():
        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "fedgp.cli", "fit", str(data), "--target", "y", "--group", "owner",
               "--rounds", "1", "--stop", "none", "--quiet", "--out", str(out)]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=cap, timeout=600)


def _owners_csv(path: Path, owners: int) -> Path:
    rng = np.random.default_rng(0)
    n = 2 * owners
    labels = np.char.add("o", np.repeat(np.arange(owners), 2).astype(str))
    frame = pd.DataFrame({"x1": rng.random(n), "x2": rng.random(n), "y": rng.normal(size=n), "owner": labels})
    frame.to_csv(path, index=False)
    return path


def _one_line_refusal(done, *words):
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == OUT_OF_MEMORY, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and lines[0].startswith("fedgp fit: "), done.stderr[-2000:]
    for word in words:
        assert word in lines[0]


@linux_only
def test_too_many_owners_for_the_limit_is_one_line(tmp_path):
    # 300,000 owners need well over 1.25 GiB of address space (about 0.4 GiB for the libraries alone)
    done = _fit_under_limit(_owners_csv(tmp_path / "owners.csv", 300_000), tmp_path / "out", 1.25)
    _one_line_refusal(done, "out of memory", "1.25 GiB", "ulimit -v", "fewer owners")


@linux_only
def test_a_limit_too_small_for_the_libraries_is_one_line(tmp_path):
    done = _fit_under_limit(_owners_csv(tmp_path / "owners.csv", 10), tmp_path / "out", 0.5)
    _one_line_refusal(done, "0.50 GiB", "raise the limit")


@pytest.mark.parametrize(
    "err",
    [MemoryError(), RuntimeError("std::bad_alloc"),
     RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 8000000 bytes. Error code 12 (Cannot allocate memory)"),
     RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")],
)  # fmt: skip
def test_allocation_failures_are_recognised(err):
    assert out_of_memory(err)


@given(st.text(max_size=60).filter(lambda t: not any(w in t.lower() for w in ("alloc", "memory"))))
def test_other_runtime_errors_keep_their_traceback(text):
    assert not out_of_memory(RuntimeError(text))
    assert not out_of_memory(ValueError("can't allocate memory"))


def test_an_allocation_failure_inside_a_command_is_one_line(monkeypatch, tmp_path, capsys):
    import fedgp.cli

    def fails(args):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 80 GB")

    monkeypatch.setattr(fedgp.cli, "_fit", fails)
    assert main(["fit", str(tmp_path / "x.csv"), "--target", "y", "--group", "o"]) == OUT_OF_MEMORY
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedgp fit: out of memory (DefaultCPUAllocator")

    def breaks(args):
        raise RuntimeError("a bug, not memory")

    monkeypatch.setattr(fedgp.cli, "_fit", breaks)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["fit", str(tmp_path / "x.csv"), "--target", "y", "--group", "o"])


def _small_fit(owners: int = 23):
    import fedgp
    from fedgp.data import Federation
    from fedgp.presets import make_spec
    from fedgp.strategies import FGPR

    rng = np.random.default_rng(3)
    sizes = rng.integers(2, 6, owners)
    X, y = rng.uniform(0, 10, (int(sizes.sum()), 2)), rng.normal(size=int(sizes.sum())) * 3 + 7
    federation = Federation.from_runs(X, y, sizes, ids=[f"o{i}" for i in range(owners)])
    return fedgp.fit(
        make_spec("rbf", "zero", d=2), federation, FGPR(), rounds=2, engine="batched"
    ), federation


def _one_engine_for_all(result, federation, step: int) -> dict:
    """The in-sample metrics as fedgp computed them before: one engine hosting every owner, asked
    ``step`` owners at a time."""
    import torch

    from fedgp.commands import _in_sample
    from fedgp.engines import Batched
    from fedgp.run.exchange import ask

    engine = Batched(check=False).build(result.spec, [_in_sample(c) for c in federation], 0)
    engine.prepare(result.strategy, 0)
    out = {
        name: torch.full((len(federation),), float("nan"), dtype=torch.float64) for name in ("rmse", "nll")
    }
    for start in range(0, len(federation), step):
        replies = ask(
            result, "evaluate", torch.arange(start, min(start + step, len(federation))), engine=engine
        )
        for name, column in out.items():
            column[replies.clients] = replies.individual[name].to(torch.float64)
    return {name: column.numpy() for name, column in out.items()}


def test_in_sample_metrics_hold_one_step_of_owners_at_a_time(monkeypatch):
    import fedgp.commands
    from fedgp.engines import Batched

    result, federation = _small_fit()
    hosted = []
    build = Batched.build

    def recording(self, spec, clients, *args, **kwargs):
        hosted.append(len(clients))
        return build(self, spec, clients, *args, **kwargs)

    monkeypatch.setattr(Batched, "build", recording)
    monkeypatch.setattr(fedgp.commands, "OWNERS_PER_STEP", 5)
    stepped = fedgp.commands.fit_metrics(result, federation, False, False)
    assert hosted == [5, 5, 5, 5, 3]  # an engine per step, of that step's owners only
    for name, values in _one_engine_for_all(result, federation, 5).items():
        np.testing.assert_array_equal(stepped[name].to_numpy(), values)  # the same numbers, bit for bit


def test_engines_and_transforms_keep_no_per_client_extras():
    from fedgp.engines import Batched

    result, federation = _small_fit()
    engine = Batched(check=False).build(result.spec, list(federation), 0)
    assert engine._by_id is None and engine._by_key is None  # built only when a lookup needs them
    assert engine.positions([4, 2]).tolist() == [4, 2] and engine._positions["o3"] == 3
    assert not result.transform.is_identity
    made, _, _ = result.transform.apply_all(list(federation))
    for client in made:  # each its own copy: a view would hold (and pickle) its whole block of clients
        assert client.X.untyped_storage().nbytes() == client.X.numel() * 8
        assert client.y.untyped_storage().nbytes() == client.y.numel() * 8
