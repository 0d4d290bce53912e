"""The compiled steps' thread count follows the CPUs the process may use (affinity, cgroup quota)."""

import os
import threading
import time

import pytest
import torch

from fedgp.engines import compiled, cpus
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
    monkeypatch.setattr(cpus, "contention", cpus.Contention(sample=None))  # not this machine's load
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
        fed = fedgp.synthetic.gp_federation(num_clients=40, n=30, d=2, seed=0).federation
        strategy = fedgp.strategies.FGPR.authors(local_steps=2, batch_size=8)
        fedgp.fit(fedgp.synthetic.gp_spec(2, "rbf"), fed, strategy, engine="batched", rounds=2)
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


def test_without_the_cpus_counters_contention_backs_off_to_what_the_threads_got_and_probes_again():
    from fedgp.engines.cpus import CONTENDED, FIRST_PROBE_WAIT, MAX_PROBE_WAIT, Contention

    assert FIRST_PROBE_WAIT == 4  # the waits below

    c = Contention(sample=None)  # where /proc/stat cannot be read: the threads' own share
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


def test_the_threads_follow_the_cpus_other_processes_left_free(monkeypatch):
    """Over each interval of at least MIN_INTERVAL s: the affinity's CPUs, less the busy time that
    was not this process's, at most the quota; decided without running a call contended."""
    from fedgp.engines import cpus
    from fedgp.engines.cpus import MIN_INTERVAL, Contention, CpuSample

    clock = {"now": 100.0}
    monkeypatch.setattr(cpus.time, "monotonic", lambda: clock["now"])
    samples = iter([
        CpuSample(100.0, busy=50.0, own=1.0, cpus=2),  # at import
        CpuSample(101.0, busy=51.0, own=2.0, cpus=2),  # 1 s: the busy second was ours (our import)
        CpuSample(102.0, busy=53.0, own=3.0, cpus=2),  # ours 1 s, another process 1 s
        CpuSample(103.0, busy=54.7, own=4.3, cpus=2),  # ours 1.3 s (2 threads), others 0.4 s
        CpuSample(104.0, busy=60.0, own=5.0, cpus=8),  # 8 CPUs in the affinity, others busy on 4.6
        None,  # unreadable: the last reading stands
    ])  # fmt: skip
    c = Contention(sample=lambda: next(samples), cpus=2)
    assert c.threads(2) == 2 and c.free is None  # no interval yet: what was asked
    clock["now"] = 101.0
    assert c.threads(2) == 2 and c.free == pytest.approx(2.0)
    clock["now"] = 101.0 + MIN_INTERVAL / 2
    assert c.threads(2) == 2  # too short an interval to read: the last decision
    clock["now"] = 102.0
    assert c.threads(2) == 1 and c.free == pytest.approx(1.0)  # one busy process beside
    assert c.threads(1) == 1
    clock["now"] = 103.0
    assert c.threads(2) == 2 and c.free == pytest.approx(1.6)  # 1.6 CPUs free: rounds to 2
    c.record(2, 0.1)  # the threads' share is not used where the counters are read
    clock["now"] = 104.0
    assert c.threads(4) == 2 and c.free == pytest.approx(2.0)  # 3.4 CPUs free, the quota is 2
    clock["now"] = 105.0
    assert c.threads(2) == 2 and c.free == pytest.approx(2.0)


def test_the_cpus_counters_are_read_from_proc_stat(tmp_path, monkeypatch):
    from fedgp.engines import cpus

    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 100 5000 10 0 0 0 0 0\n"
        "cpu0 100 5 20 1000 3 1 1 2 7 0\n"  # busy 100+5+20+1+1+2 = 129 ticks (guest 7 is in user)
        "cpu1 300 0 50 2000 5 0 4 0 0 0\n"  # busy 354
        "cpu2 999 0 0 0 0 0 0 0 0 0\n"  # not in the affinity
        "intr 12345\n"
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    sample = cpus.cpu_sample(stat)
    assert sample.cpus == 2
    assert sample.busy == pytest.approx((129 + 354) / os.sysconf("SC_CLK_TCK"))
    assert sample.own == pytest.approx(time.process_time(), abs=0.5)
    assert cpus.cpu_sample(tmp_path / "missing") is None
    stat.write_text("cpu0 1 2\n")  # a format not known here: no reading, never an error
    assert cpus.cpu_sample(stat) is None


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
