"""How many CPUs this process may use, and so how many threads the compiled steps start.

Why not ``os.cpu_count()`` or torch's default: both count the machine's cores, but a process
pinned to fewer (``taskset``, a batch scheduler's affinity) or given a CPU quota by its container
(cgroup ``cpu.max``, Kubernetes' CPU limit) that starts more threads than it may run gets them
descheduled in turn, and a thread waiting for a descheduled one makes the whole round slower than
one thread. ``os.process_cpu_count()`` (Python 3.13) counts the affinity but not the quota; no
maintained library reads both for us, so it is done here: the affinity from
``os.sched_getaffinity``, the quota from cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, rounded up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

__all__ = ["usable_cpus", "default_threads"]

_CGROUP = Path("/sys/fs/cgroup")


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
    :func:`usable_cpus`."""
    return max(1, min(torch.get_num_threads(), usable_cpus()))
