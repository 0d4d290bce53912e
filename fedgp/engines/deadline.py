"""A client's task cut off at its timeout, while it runs.

Python cannot stop a thread, so a hung client (a local update that never returns: a deadlock, a
3,600-s sleep, an owner's code waiting on a network share) would hold an in-process engine for
ever if the timeout were checked after the reply. :func:`run_within` runs the task on a worker
thread and waits at most the timeout; past it the thread is *abandoned*: it keeps running until
its work returns, but its reply is never read and the engine stops sharing anything mutable with
it (:meth:`fedgp.engines.base.InProcessEngine.abandoned` rebuilds the engine's GPyTorch model and
modules, which the abandoned work may still write into). A process would be stopped for good but
would need the data and the task to cross a process boundary per client; the engines that run
clients elsewhere (Ray, Flower) cut off with their own deadlines instead.

Time the engine spends on itself rather than on the clients, compiling its kernels on their first
call (seconds, once per process), does not count: such code runs inside :func:`not_counted`.

What an abandoned thread still costs: the CPU it spins on, if it spins, until its work returns.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

from fedgp.errors import ClientTimeout

__all__ = ["Abandoned", "run_within", "not_counted"]

#: What :func:`run_within` raises when it cuts a task off (fedgp's :class:`ClientTimeout`).
Abandoned = ClientTimeout

T = TypeVar("T")


class _Clock:
    """The seconds of a task spent inside :func:`not_counted` (read by the waiting thread)."""

    def __init__(self) -> None:
        self.lock, self.done, self.depth, self.since = threading.Lock(), 0.0, 0, 0.0

    def enter(self) -> None:
        with self.lock:
            self.depth += 1
            if self.depth == 1:
                self.since = time.monotonic()

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.done += time.monotonic() - self.since

    def excluded(self) -> float:
        with self.lock:
            return self.done + (time.monotonic() - self.since if self.depth else 0.0)


_CLOCK: contextvars.ContextVar[_Clock | None] = contextvars.ContextVar("fedgp_task_clock", default=None)


@contextmanager
def not_counted() -> Iterator[None]:
    """The block's time does not count against the running task's timeout (no-op outside one)."""
    clock = _CLOCK.get()
    if clock is None:
        yield
        return
    clock.enter()
    try:
        yield
    finally:
        clock.leave()


def run_within(work: Callable[[], T], seconds: float) -> T:
    """``work()`` on a worker thread, its result or its exception, or :class:`Abandoned` once
    ``seconds`` pass. The thread sees the caller's context variables (e.g. the compiled tiles'
    thread count) and autograd mode, which threads do not inherit."""
    outcome: dict[str, object] = {}
    context, clock, grad = contextvars.copy_context(), _Clock(), torch.is_grad_enabled()

    def timed() -> T:
        _CLOCK.set(clock)
        return work()

    def target() -> None:
        try:
            with torch.set_grad_enabled(grad):
                outcome["value"] = context.run(timed)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting caller below
            outcome["error"] = err

    worker = threading.Thread(target=target, name="fedgp-client-task", daemon=True)
    began = time.monotonic()
    worker.start()
    while worker.is_alive():
        left = seconds + clock.excluded() - (time.monotonic() - began)
        if left <= 0:
            break
        worker.join(left)
    if worker.is_alive():
        raise Abandoned(f"no reply within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
