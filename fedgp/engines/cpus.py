"""How many CPUs this process may use, and so how many threads the compiled steps start.

Why not ``os.cpu_count()`` or torch's default: both count the machine's cores, but a process
pinned to fewer (``taskset``, a batch scheduler's affinity) or given a CPU quota by its container
(cgroup ``cpu.max``, Kubernetes' CPU limit) that starts more threads than it may run gets them
descheduled in turn, and a thread waiting for a descheduled one makes the whole round slower than
one thread. ``os.process_cpu_count()`` (Python 3.13) counts the affinity but not the quota; no
maintained library reads both for us, so it is done here: the affinity from
``os.sched_getaffinity``, the quota from cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, rounded up.

:func:`torch_on_one_thread` is what makes a second thread never hurt (issue 34, measured by
``benchmarks/threads_under_load.py``): with another process busy beside a batched fit, torch's
OpenMP threads wait at every operation's barrier for a thread the kernel has descheduled, and a fit
with 2 torch threads took 1.6-2.1x as long as with 1. The compiled tiles' threads take pieces of
work from a queue (no barrier but the end of the call), so they keep their threads while torch's
own small operations around them (states, aggregation, transforms) run on one.

:class:`Contention` covers what the CPU count cannot see: other processes busy on the CPUs this
process may use. Where Linux's ``/proc/stat`` can be read, it counts the CPU time the CPUs of this
process's affinity spent busy, less this process's own CPU time, over the last interval of at least
:data:`MIN_INTERVAL` s: the CPUs the *other* processes kept busy. The tiles run on the CPUs left
(rounded, at least one, never more than asked), decided afresh at each call after such an
interval; the first call reads the interval since fedgp was imported. No call has to run contended
to find out (a probe at the full count cost a contended call now and then, and kept 2 threads at
0.91-0.93x of one with a busy process beside, ``benchmarks/threads_under_load.py``). Elsewhere each
call of the tiles measures how much of their wall time its threads got a CPU; below
:data:`CONTENDED` the next calls run on as many threads as got a CPU's worth, and a call at the
full count probes again after 4, 8, 16 ... calls (back to the full count when it is not contended).
``fit`` runs its whole loop under the engine's setting (:meth:`fedgp.engines.base.Engine.thread_setting`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "usable_cpus",
    "default_threads",
    "torch_on_one_thread",
    "torch_on_tile_threads",
    "Contention",
    "CONTENDED",
    "MIN_INTERVAL",
    "CpuSample",
    "cpu_sample",
    "contention",
]

_CGROUP = Path("/sys/fs/cgroup")
#: The compiled tiles' thread count inside :func:`torch_on_one_thread` (per Python thread).
_TILE_THREADS: ContextVar[int | None] = ContextVar("fedgp_tile_threads", default=None)


def _quota(root: Path) -> float | None:
    """CPUs the cgroup quota allows (``None``: no quota or no cgroup file to read)."""
    try:  # cgroup v2: "max 100000" or "150000 100000"
        limit, period = (root / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1: -1 for no quota
        limit = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if limit <= 0 or period <= 0 else limit / period
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup_root: Path = _CGROUP) -> int:
    """The CPUs this process may run on at once: its affinity, bounded by its cgroup's CPU quota
    (rounded up; at least 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    quota = _quota(cgroup_root)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def default_threads() -> int:
    """Threads for the compiled steps when the caller names none: torch's thread count (what the
    user set with ``torch.set_num_threads``, or torch's default), never more than
    :func:`usable_cpus`; inside :func:`torch_on_one_thread`, the count from before it."""
    inside = _TILE_THREADS.get()
    if inside is not None:
        return inside
    return max(1, min(torch.get_num_threads(), usable_cpus()))


@contextmanager
def torch_on_one_thread() -> Iterator[int]:
    """torch's own operations on one thread for the block, the compiled tiles on
    :func:`default_threads` as it was before (yielded). torch's setting is restored after."""
    tiles, before = default_threads(), torch.get_num_threads()
    token = _TILE_THREADS.set(tiles)
    torch.set_num_threads(1)  # OpenMP's setting is the calling thread's: other threads keep theirs
    try:
        yield tiles
    finally:
        torch.set_num_threads(before)
        _TILE_THREADS.reset(token)


@contextmanager
def torch_on_tile_threads() -> Iterator[None]:
    """Inside :func:`torch_on_one_thread`, torch's operations back on the tiles' threads for a block
    that is one large BLAS-bound computation and nothing else (a large client's posterior,
    :mod:`fedgp.models.large`); outside it, :func:`default_threads`. Restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(default_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: The share of their wall time the tiles' threads must get a CPU for, or the call counts as contended.
CONTENDED = 0.8
#: Calls at the lower count after the first contended call (then twice as many after each contended
#: probe, up to :data:`MAX_PROBE_WAIT`): a contended probe costs a call at the slower count.
FIRST_PROBE_WAIT = 4
#: The longest wait, in calls, between two probes of the full thread count while contended.
MAX_PROBE_WAIT = 64


#: The shortest interval (s) over which the CPUs' busy time is read: /proc/stat counts in clock
#: ticks (10 ms), so shorter ones would be mostly rounding.
MIN_INTERVAL = 0.1
_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuSample:
    """A moment's counters: wall time (s), the CPU time the affinity's ``cpus`` CPUs have spent busy
    since boot (s, all processes) and this process's own CPU time (s, all its threads)."""

    wall: float
    busy: float
    own: float
    cpus: int


def cpu_sample(stat: Path = _STAT) -> CpuSample | None:
    """Now's :class:`CpuSample` (``None`` where ``/proc/stat`` or the affinity cannot be read)."""
    try:
        mine = os.sched_getaffinity(0)
        text = stat.read_text()
        tick = os.sysconf("SC_CLK_TCK")
        busy = 0
        for line in text.splitlines():
            name, _, rest = line.partition(" ")
            if not name[3:].isdigit() or not name.startswith("cpu") or int(name[3:]) not in mine:
                continue
            # user nice system idle iowait irq softirq steal (guest times are inside user and nice)
            ticks = [int(v) for v in rest.split()[:8]]
            busy += sum(ticks) - ticks[3] - ticks[4]
    except (AttributeError, OSError, ValueError, IndexError):  # not Linux, or a format not known here
        return None
    return CpuSample(time.monotonic(), busy / tick, time.process_time(), len(mine))


class Contention:
    """Threads for the next call of the compiled tiles, from what the CPUs were doing.

    With a ``sample`` function (default :func:`cpu_sample`) that reads the machine, :meth:`threads`
    gives the CPUs of the affinity that other processes left free over the last interval (at most
    ``cpus``, default :func:`usable_cpus`). Without one (``sample=None``, or where it returns
    ``None`` from the start), :meth:`record` takes a call's thread count and the share of its
    threads' wall time they ran on a CPU, and :meth:`threads` backs off to what they got, probing
    the full count now and then. Results never depend on the count (a tile's numbers do not), only
    the time."""

    def __init__(self, sample=cpu_sample, cpus: int | None = None):
        self._lock = threading.Lock()
        self._sample = sample
        self._cpus = cpus
        self._last = sample() if sample is not None else None
        self.free: float | None = None  # CPUs the others left free, last interval (None: not known)
        self.limit: int | None = None  # None: not contended
        self.wait = 0  # calls at ``limit`` before the next probe of the full count
        self.backoff = FIRST_PROBE_WAIT

    def threads(self, want: int) -> int:
        """``want``, or fewer while other processes hold the CPUs."""
        with self._lock:
            if self._last is not None:
                self._read()
                if self.free is not None:
                    return max(1, min(want, math.floor(self.free + 0.5)))
            if self.limit is None or want <= self.limit:
                return want
            if self.wait <= 0:
                return want  # a probe
            self.wait -= 1
            return self.limit

    def _read(self) -> None:
        """The CPUs left free by other processes since the last reading, once an interval has passed."""
        if time.monotonic() - self._last.wall < MIN_INTERVAL:
            return
        now = self._sample()
        if now is None:
            return
        wall = now.wall - self._last.wall
        others = max(0.0, (now.busy - self._last.busy) - (now.own - self._last.own))
        # the affinity's CPUs less the others' use; never more than the quota allows (a container's
        # affinity can be a whole host whose other CPUs are busy with other containers)
        quota = self._cpus if self._cpus is not None else usable_cpus()
        self.free, self._last = min(float(quota), now.cpus - others / wall), now

    def record(self, threads: int, share: float) -> None:
        """What a call on ``threads`` threads measured (``share``: CPU time / wall time of its threads);
        used only where the CPUs' busy time cannot be read."""
        if threads <= 1 or self._last is not None:
            return
        with self._lock:
            if share >= CONTENDED:
                self.limit, self.wait, self.backoff = None, 0, FIRST_PROBE_WAIT
                return
            self.limit = max(1, int(threads * share))
            self.wait = self.backoff
            self.backoff = min(2 * self.backoff, MAX_PROBE_WAIT)


#: This process's record (the compiled tiles consult and update it).
contention = Contention()
