"""Table 1's jobs: the process pool, the cache of finished jobs, and the rows a run keeps from earlier.

Every job draws its data and seeds its training from its own seed, so the numbers do not depend on
the number of workers (``FEDGP_WORKERS``) or on the order in which jobs finish. With ``FEDGP_CACHE``
set, every finished job is kept in ``$FEDGP_CACHE/table1`` (a :class:`~fedgp.experiments.common.
TaskCache` whose files are named by a hash of the job and the protocol fields it depends on).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedgp.errors import InputError
from fedgp.experiments.common import TaskCache
from fedgp.experiments.table1.methods import run_batched, run_once
from fedgp.experiments.table1.protocol import BATCHED_METHODS, RUN_COLUMNS, Protocol, resolve_function
from fedgp.run.progress import progress_bar

__all__ = ["workers", "map_jobs", "run_job", "collect_runs"]


def workers() -> int:
    """Worker processes for the repeats: ``FEDGP_WORKERS`` (default 1).

    Every job draws its data and seeds its training from its own seed, so the numbers do not depend
    on the number of workers or on the order in which jobs finish.
    """
    value = os.environ.get("FEDGP_WORKERS", "1").strip() or "1"
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"FEDGP_WORKERS must be a positive integer, got {value!r}") from None
    if n < 1:
        raise InputError(f"FEDGP_WORKERS must be a positive integer, got {value!r}")
    return n


def _one_thread() -> None:
    torch.set_num_threads(1)


def map_jobs(fn: Callable, jobs: list[tuple], progress: bool | None, desc: str) -> list:
    """``[fn(*job) for job in jobs]``, in ``workers()`` processes when more than one, in job order."""
    bar = dict(total=len(jobs), desc=desc, progress=progress, leave=True)
    n = min(workers(), len(jobs))
    if n <= 1:
        return [fn(*job) for job in progress_bar(jobs, **bar)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=context, initializer=_one_thread) as pool:
        return list(progress_bar(pool.map(fn, *zip(*jobs)), **bar))


def _job_settings(kind: str, protocol: Protocol) -> dict:
    """The protocol fields a job's rows depend on: MF-DGP's (and the test size) for a batched job,
    every other field for a per-repeat job, so that changing one method's settings reruns only it."""
    fields = asdict(protocol)
    mine = {k: v for k, v in fields.items() if k.startswith("mfdgp_") == (kind == "batched")}
    return {**mine, "n_test": protocol.n_test}


def _cached(kind: str, function, key: tuple, protocol: Protocol, compute: Callable[[], pd.DataFrame]):
    """``compute()``'s rows, kept in ``$FEDGP_CACHE/table1`` (when set) under a name made of the
    function and a hash of the job and the protocol fields it depends on, so another protocol never
    reads it. (A changed formula under the same function name is not seen: use a fresh cache.)"""
    root = os.environ.get("FEDGP_CACHE")
    if not root:
        return compute()
    cache = TaskCache(Path(root) / "table1", parts=("",))
    fn = resolve_function(function)
    text = repr((kind, fn.name, fn.bounds.tolist(), fn.paper_sizes, key, _job_settings(kind, protocol)))
    stem = f"{fn.name}-{kind}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"
    found = cache.load(stem)
    if found is not None:
        return found[0].reindex(columns=RUN_COLUMNS)
    frame = compute()
    cache.save(stem, (frame,))
    return frame


def run_job(function, seed, methods, sizes, batch, protocol) -> pd.DataFrame:
    """One repeat's per-repeat methods (:func:`~fedgp.experiments.table1.methods.run_once`), cached."""
    proto = protocol if batch is None else replace(protocol, batch_size=batch)
    return _cached(
        "once",
        function,
        (seed, tuple(methods), sizes, batch),
        proto,
        lambda: run_once(function, seed, methods, proto, sizes),
    )


def _batched_job(function, seeds, method, sizes, batch, protocol) -> pd.DataFrame:
    proto = protocol if batch is None else replace(protocol, batch_size=batch)
    return _cached(
        "batched",
        function,
        (tuple(seeds), method, sizes, batch),
        proto,
        lambda: run_batched(function, seeds, method, proto, sizes),
    )


def _job_key(function, sizes, batch) -> tuple:
    return (resolve_function(function).name, None if sizes is None else tuple(sorted(sizes.items())), batch)


def _reusable(reuse: pd.DataFrame | None, function, sizes, seed: int, methods) -> pd.DataFrame:
    """The rows of ``reuse`` for this job: the function, HF size and seed, one of ``methods``."""
    if reuse is None or reuse.empty:
        return pd.DataFrame(columns=RUN_COLUMNS)
    fn = resolve_function(function)
    hf = fn.paper_sizes[-1] if sizes is None or "high" not in sizes else int(sizes["high"])
    rows = reuse[
        (reuse["function"] == fn.name)
        & (reuse["hf_size"] == hf)
        & (reuse["seed"] == seed)
        & reuse["method"].isin(list(methods))
    ]
    return rows.reindex(columns=RUN_COLUMNS)


def _as_flag(value) -> bool | None:
    """A ``converged`` cell as read back from any CSV (True, 1.0, "True") or None when empty."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA or value == "":
        return None
    return str(value).strip().lower() in ("true", "1", "1.0")


def _plan(jobs: list[tuple], reuse: pd.DataFrame | None) -> tuple[list, list, dict]:
    """Split ``jobs`` into the rows kept from ``reuse``, the per-repeat jobs to run and the batched
    jobs to run (one per setting and batched method, with the (job index, seed) of its repeats)."""
    kept, once, batched = [], [], {}
    for index, (function, seed, methods, sizes, batch) in enumerate(jobs):
        old = _reusable(reuse, function, sizes, seed, methods)
        kept.append(old.assign(_job=index))
        todo = [m for m in methods if m not in set(old["method"])]
        per_repeat = tuple(m for m in todo if m not in BATCHED_METHODS)
        if per_repeat:
            once.append((index, (function, seed, per_repeat, sizes, batch)))
        for m in todo:
            if m in BATCHED_METHODS:
                key = (_job_key(function, sizes, batch), m)
                batched.setdefault(key, (function, sizes, batch, m, []))[4].append((index, seed))
    return [k for k in kept if not k.empty], once, batched


def collect_runs(
    jobs: list[tuple],
    protocol: Protocol,
    progress: bool | None,
    desc: str,
    reuse: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every job's rows: ``jobs`` are ``(function, seed, methods, sizes, batch)``.

    Per-repeat methods run one job per repeat; :data:`BATCHED_METHODS` one job per setting (all its
    seeds at once). Rows of ``reuse`` (earlier per-repeat rows) for a job's method are kept instead
    of running it. The rows come back in job order, methods in each job's order."""
    frames, once, batched = _plan(jobs, reuse)
    results = map_jobs(run_job, [(*job, protocol) for _, job in once], progress, desc)
    frames += [frame.assign(_job=index) for (index, _), frame in zip(once, results)]
    if batched:
        groups = list(batched.values())
        calls = [
            (f, [s for _, s in members], m, sizes, batch, protocol) for f, sizes, batch, m, members in groups
        ]
        results = map_jobs(_batched_job, calls, progress, f"{desc} ({', '.join(BATCHED_METHODS)})")
        for (_, _, _, _, members), frame in zip(groups, results):
            frames.append(frame.reset_index(drop=True).assign(_job=[index for index, _ in members]))
    if not frames:
        return pd.DataFrame(columns=RUN_COLUMNS)
    runs = pd.concat([f for f in frames if not f.empty], ignore_index=True)
    runs["_method"] = [list(jobs[j][2]).index(m) for j, m in zip(runs["_job"], runs["method"])]
    runs = runs.sort_values(["_job", "_method"], kind="stable").drop(columns=["_job", "_method"])
    runs = runs.reset_index(drop=True).reindex(columns=RUN_COLUMNS)
    # rows of methods without rounds leave NaN in these columns: keep them integers and booleans
    runs["rounds"] = pd.to_numeric(runs["rounds"]).astype("Int64")
    runs["converged"] = runs["converged"].map(_as_flag).astype("boolean")
    return runs
