"""The compiled steps' thread count follows the CPUs the process may use (affinity, cgroup quota)."""

import os
import threading

import pytest
import torch

from fedgp.engines import compiled
from fedgp.engines.cpus import default_threads, usable_cpus

AFFINITY = len(os.sched_getaffinity(0))


def cgroup(tmp_path, v2=None, v1=None):
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return tmp_path


@pytest.mark.parametrize(
    "v2, v1, quota",
    [
        ("max 100000", None, None),  # no quota
        ("50000 100000", None, 1),  # half a CPU: one thread
        ("150000 100000", None, 2),  # 1.5 CPUs, rounded up
        ("100000 100000", None, 1),
        (None, (-1, 100000), None),  # cgroup v1, no quota
        (None, (100000, 100000), 1),
        (None, None, None),  # no cgroup files
        ("garbage", None, None),
    ],
)
def test_the_quota_bounds_the_affinity(tmp_path, v2, v1, quota):
    expected = AFFINITY if quota is None else min(AFFINITY, quota)
    assert usable_cpus(cgroup(tmp_path, v2, v1)) == expected


def test_pinned_to_one_cpu_one_thread(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert usable_cpus() == 1 and default_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_torch_threads_bound_ours_and_the_tiles_use_them(monkeypatch):
    threads = torch.get_num_threads()
    seen = []
    monkeypatch.setattr(compiled, "default_threads", lambda: 2)
    monkeypatch.setattr(compiled, "_pool", lambda workers: seen.append(workers) or _Inline())
    try:
        torch.set_num_threads(1)
        assert default_threads() == 1
        compiled.run_tiles(lambda t0, t1: None, 16)
        assert seen == [1]  # two threads: the caller and one from the pool
    finally:
        torch.set_num_threads(threads)


class _Inline:
    def submit(self, fn):
        fn()
        return _Done()


class _Done:
    def result(self):
        return None


def test_inside_a_batched_round_torch_runs_on_one_thread_and_the_tiles_keep_theirs(monkeypatch):
    import fedgp
    from fedgp.engines import cpus

    threads = torch.get_num_threads()
    seen = []
    run_tiles = compiled.run_tiles

    def spy(fn, n_tiles, *args, threads=None, **kw):
        seen.append((torch.get_num_threads(), cpus.default_threads()))
        return run_tiles(fn, n_tiles, *args, threads=threads, **kw)

    monkeypatch.setattr(compiled, "run_tiles", spy)
    monkeypatch.setattr(cpus, "usable_cpus", lambda cgroup_root=None: 8)
    try:
        torch.set_num_threads(2)
        fed = fedgp.data.gp_federation(num_clients=40, n=30, d=2, seed=0).federation
        strategy = fedgp.strategies.FGPR.authors(local_steps=2, batch_size=8)
        fedgp.fit(fedgp.data.gp_spec(2, "rbf"), fed, strategy, engine="batched", rounds=2)
        # every round's tiles with torch on one thread and 2 tile threads (the engine's check at
        # construction runs outside a round, with torch's own setting)
        assert seen.count((1, 2)) >= 2 and set(seen) <= {(1, 2), (2, 2)}
        assert torch.get_num_threads() == 2  # restored after each round

        # Nested: the inner block keeps the outer count for the tiles and restores one thread.
        with cpus.torch_on_one_thread() as outer:
            with cpus.torch_on_one_thread() as inner:
                assert outer == inner == 2 and torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_contention_backs_off_to_the_threads_that_got_a_cpu_and_probes_again():
    from fedgp.engines.cpus import CONTENDED, FIRST_PROBE_WAIT, MAX_PROBE_WAIT, Contention

    assert FIRST_PROBE_WAIT == 4  # the waits below

    c = Contention()
    assert c.threads(2) == 2
    c.record(2, 0.95)  # two threads, each on a CPU nearly all the time: keep them
    assert c.threads(2) == 2
    c.record(1, 0.1)  # a one-thread call says nothing about the CPUs
    assert c.threads(2) == 2
    c.record(2, 0.6)  # one busy process beside: 1.2 CPUs' worth for 2 threads
    assert [c.threads(2) for _ in range(6)] == [1, 1, 1, 1, 2, 2]  # 4 calls at 1, then a probe at 2
    c.record(2, 0.6)  # the probe is contended too: wait twice as long
    assert [c.threads(2) for _ in range(9)] == [1] * 8 + [2]
    for _ in range(20):
        c.record(2, 0.5)
    assert c.backoff == MAX_PROBE_WAIT
    c.record(2, CONTENDED)  # the other process left
    assert c.threads(2) == 2 and c.limit is None and c.backoff == FIRST_PROBE_WAIT
    c.record(8, 0.5)  # 8 threads with 4 CPUs' worth
    assert c.threads(8) == 4 and c.threads(3) == 3  # a caller wanting fewer gets what it wants


def test_the_tiles_run_on_the_threads_contention_allows_and_report_what_they_got(monkeypatch):
    from fedgp.engines import cpus

    recorded, calls = [], []
    monkeypatch.setattr(cpus.contention, "threads", lambda want: 1 if len(calls) == 0 else want)
    monkeypatch.setattr(cpus.contention, "record", lambda threads, share: recorded.append((threads, share)))

    def fn(out, t0, t1):
        calls.append(threading.get_ident())
        out[t0:t1] += 1

    import numpy as np

    out = np.zeros(40)
    compiled.run_tiles(fn, 40, out, threads=None)  # limited to 1 thread: nothing to record
    compiled.run_tiles(fn, 40, out, threads=2)
    assert (out == 2).all()
    assert len(recorded) == 1 and recorded[0][0] == 2 and 0.0 <= recorded[0][1] <= 1.5
