"""``fedgp flower supernode``: Flower's own SuperNode (1.41 or 1.42), with the same processes,
messages and results, and without its waiting.

    fedgp flower supernode <flower-supernode's arguments>

runs ``flower-supernode``'s ``main`` in this process, in ``--isolation process`` mode, and starts
that mode's SuperExec itself (``python -m fedgp.flower.fast superexec``, a child that stops with
this process through ``--parent-pid``). A stock SuperNode costs about 10 s per round of a fedgp
fit on a quiet machine: it sleeps 3 s after every empty pull, and every message starts a new
``flwr-clientapp`` process that imports torch, GPyTorch and fedgp again (about 2 s, more on first
use of a kernel). Flower 1.41 and 1.42 offer no setting for either (the SuperExec's executors
start a process per task; only its task poll has an environment variable), so this module changes
two things in Flower's behaviour, none in its files:

* No fixed sleeps on the message path. The SuperNode's loop
  (``flwr.supernode.start_client_internal``) sleeps 3 s after an empty pull: now intervals
  growing from ``FEDGP_FLOWER_POLL`` (0.05 s) by ``FEDGP_FLOWER_BACKOFF`` (x1.1) since its last
  message, up to those 3 s (an idle node polls as Flower's does). It sleeps 0.5 s while a
  ClientApp's reply is not in its state: now it waits on a pipe that each ClientApp writes to as
  it exits (0.5 s at most, as before). Its SuperExec (``run_superexec``) sleeps 1 s between task
  polls: now it waits on a pipe the SuperNode writes to when it has stored a message (1 s at
  most). Done by replacing those two modules' ``time`` global with a copy whose ``sleep`` is
  ours, and by wrapping the loop's ``_pull_and_store_message`` and ``_push_messages``. An
  object of a fresh message that has not arrived yet is retried after 0.02 s, not Flower's first
  1 s (:func:`short_object_pulls`, also called by fedgp's ServerApp for its replies).
* One import per node instead of one per message: the SuperExec imports torch, GPyTorch, fedgp
  and Flower, runs one tiny in-process fedgp round (lazy imports, numba compilation), and then,
  for each ClientApp task, forks a child that runs ``flwr-clientapp``'s own function
  (``run_clientapp``) with the task's token and exits. The executor is swapped into Flower's own
  SuperExec loop; other task types, and runs that install dependencies at run time, go to
  Flower's ``SubprocessExecutor`` (a new process, as before).

These rely on names private to Flower (:data:`FLOWER_NAMES`, the same in 1.41 and 1.42);
:func:`supported` checks them at start, and when one is missing ``fedgp flower supernode`` says so in
one line and runs Flower's own SuperNode (the ``flower-supernode`` command, its subprocess isolation)
with the same arguments: slower, never broken by a Flower release. The fast path is POSIX only
(``os.fork``; elsewhere the same fallback); the forked ClientApps run torch single-threaded (a forked
OpenMP pool can hang).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.types import LaunchResult

__all__ = [
    "main", "supernode", "superexec", "supported", "short_object_pulls", "ForkExecutor", "fedgp_warmup",
    "FLOWER_NAMES", "stock_supernode",
]  # fmt: skip

POLL_ENV, BACKOFF_ENV = "FEDGP_FLOWER_POLL", "FEDGP_FLOWER_BACKOFF"
PULL_RETRY_ENV, DEFAULT_PULL_RETRY = "FEDGP_FLOWER_PULL_RETRY", 0.02
PRELOAD_ENV, WARMUP_ENV = "FEDGP_FLOWER_PRELOAD", "FEDGP_FLOWER_WARMUP"
DEFAULT_POLL, DEFAULT_BACKOFF = 0.05, 1.1
DEFAULT_PRELOAD = "torch,gpytorch,pandas,fedgp.flower,fedgp.flower.app,fedgp.data.table,httpcore,h11"
DEFAULT_WARMUP = "fedgp.flower.fast:fedgp_warmup"
_real_sleep = time.sleep


def time_with(sleep) -> types.ModuleType:
    """A copy of the ``time`` module with another ``sleep``, for a Flower module's ``time`` global."""
    shim = types.ModuleType("time")
    shim.__dict__.update({k: v for k, v in vars(time).items() if not k.startswith("__")})
    shim.sleep = sleep
    return shim


class Wake:
    """The read end of a pipe: ``wait(t)`` returns when a byte comes or after ``t`` seconds."""

    def __init__(self, fd: int):
        self.fd, self.open = fd, True
        os.set_blocking(fd, False)

    def wait(self, timeout: float) -> None:
        if not self.open:  # every writer is gone: plain sleep
            _real_sleep(timeout)
            return
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if ready:
            try:
                while os.read(self.fd, 4096):
                    pass
                self.open = False  # b"": end of file
            except BlockingIOError:
                pass


def poke(fd: int | None) -> None:
    if fd is not None:
        try:
            os.write(fd, b"!")
        except (BlockingIOError, BrokenPipeError, OSError):
            pass  # full (a wake-up is pending anyway) or the reader is gone


class Backoff:
    """Intervals ``first``, ``first * factor``, ... capped at the caller's own; :meth:`reset` on activity."""

    def __init__(self, first: float | None = None, factor: float | None = None):
        self.first = float(os.environ.get(POLL_ENV, DEFAULT_POLL)) if first is None else first
        self.factor = float(os.environ.get(BACKOFF_ENV, DEFAULT_BACKOFF)) if factor is None else factor
        self.current = self.first

    def reset(self) -> None:
        self.current = self.first

    def sleep(self, cap: float) -> None:
        interval = min(self.current, cap)
        self.current = min(self.current * self.factor, cap)
        _real_sleep(interval)


# --- the SuperNode -------------------------------------------------------------------------------


def short_object_pulls() -> None:
    """Retry an object that is not at the other end yet after ``FEDGP_FLOWER_PULL_RETRY`` seconds
    (0.02), doubling up to Flower's cap of 10 s, instead of after Flower's first 1 s.

    A message's objects are pushed after the message itself is registered, so whoever pulls a
    fresh message (the SuperNode from the SuperLink, the ServerApp its replies) often finds an
    object not there yet and waits Flower's initial backoff, a second per exchange on loopback.
    The retries are the same calls, bounded by Flower's own limits (500 tries, 2 hours)."""
    from flwr.supercore.inflatable import inflatable_utils

    first = float(os.environ.get(PULL_RETRY_ENV, DEFAULT_PULL_RETRY))
    for function in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        if "initial_backoff" in (function.__kwdefaults__ or {}):  # else a Flower without it: as it is
            function.__kwdefaults__["initial_backoff"] = first


def supernode(argv: list[str]) -> None:
    """Run ``flower-supernode`` with ``argv`` in this process, the fast way (module docstring)."""
    import flwr.supernode.start_client_internal as sci
    from flwr.supercore.address import resolve_bind_address
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST
    from flwr.supernode.cli.flower_supernode import flower_supernode

    # The Runtime API address and its TLS, read as flower-supernode reads them.
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=SUPERNODE_UVICORN_DEFAULT_PORT)
    parser.add_argument("--ssl-ca-certfile")
    parser.add_argument("--isolation")
    parser.add_argument("--allow-runtime-dependency-installation", action="store_true")
    known, _ = parser.parse_known_args(argv)
    if known.isolation not in (None, "process"):
        raise SystemExit("fedgp flower supernode runs --isolation process (it starts its own SuperExec)")
    host = f"[{known.host}]" if ":" in known.host else known.host
    runtime = resolve_bind_address(f"{host}:{known.port}")

    # Two pipes between this process and its SuperExec: "a task is waiting" (we write after a
    # pull stored a message) and "a ClientApp is done" (each forked ClientApp writes as it exits).
    task_r, task_w = os.pipe()
    done_r, done_w = os.pipe()
    os.set_blocking(task_w, False)
    done = Wake(done_r)
    backoff = Backoff()

    def sleep(seconds: float) -> None:
        # The loop's three sleeps: 3 s after an empty pull from the SuperLink (now: intervals
        # growing from FEDGP_FLOWER_POLL after the last message, up to 3 s), and 0.5 s while the
        # reply, then its objects, are not in the node's state yet (now: until a ClientApp exits).
        if seconds >= 3:
            backoff.sleep(seconds)
        else:
            done.wait(seconds)

    sci.time = time_with(sleep)
    short_object_pulls()
    pull, push = sci._pull_and_store_message, sci._push_messages  # noqa: SLF001

    def pull_and_store(*args, **kwargs):
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            backoff.reset()
            poke(task_w)
        return run_id

    def push_messages(*args, **kwargs):
        push(*args, **kwargs)
        backoff.reset()

    sci._pull_and_store_message, sci._push_messages = pull_and_store, push_messages  # noqa: SLF001

    module = __spec__.name if __spec__ else "fedgp.flower.fast"
    command = [sys.executable, "-m", module, "superexec", "--runtime-api-address", runtime]
    command += ["--root-certificates", known.ssl_ca_certfile] if known.ssl_ca_certfile else ["--insecure"]
    command += ["--parent-pid", str(os.getpid()), "--task-fd", str(task_r), "--done-fd", str(done_w)]
    if known.allow_runtime_dependency_installation:
        command += ["--allow-runtime-dependency-installation"]
    subprocess.Popen(command, pass_fds=(task_r, done_w))  # noqa: S603 - stops with us (--parent-pid)
    os.close(task_r)
    os.close(done_w)

    sys.argv = ["flower-supernode", *_without_option(argv, "--isolation"), "--isolation", "process"]
    flower_supernode()


def _without_option(argv: list[str], option: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


# --- the SuperExec -------------------------------------------------------------------------------


class ForkExecutor:
    """A SuperExec executor (the ``Executor`` protocol of
    ``flwr.supercore.superexec.executor.types``) that forks this pre-imported process for each
    ClientApp task; the child runs ``run_clientapp`` and exits."""

    def __init__(self, done_fd: int | None = None) -> None:
        from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

        self.fallback = SubprocessExecutor()
        self.children: set[int] = set()
        self.done_fd = done_fd

    def get_eligible_capacity(
        self, supported_task_types, *, insecure=False, root_certificates_path=None
    ) -> tuple[set[TaskType], set[str]]:
        """As Flower's ``SubprocessExecutor``: which task types this executor takes now."""
        return self.fallback.get_eligible_capacity(
            supported_task_types, insecure=insecure, root_certificates_path=root_certificates_path
        )

    def wait_for_capacity(
        self, task_type=None, *, fab_hash=None, insecure=False, root_certificates_path=None
    ) -> None:
        """No capacity gate (as Flower's SubprocessExecutor)."""

    def launch(self, spec) -> LaunchResult:
        """Fork a ClientApp for ``spec`` (a ClientApp task); other tasks go to Flower's executor."""
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor.types import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP or spec.runtime_dependency_install:
            return self.fallback.launch(spec)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as err:
            return LaunchResult.failed(f"fork failed: {err}")
        if pid == 0:
            _clientapp_child(spec, self.done_fd)  # never returns
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished children (run_superexec calls this every poll)."""
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def close(self) -> None:
        """Children watch this process (their ``parent_pid``) and stop with it, as Flower's do."""


def _clientapp_child(spec, done_fd: int | None) -> None:
    code = 1
    try:
        from flwr.supercore import telemetry
        from flwr.supercore.exit import exit_handler
        from flwr.supercore.tls import validate_and_resolve_root_certificates
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        # Drop the SuperExec's exit handlers (they would close its HTTP client) and its signal
        # handlers; fresh locks, in case another thread held one when the process forked.
        exit_handler.registered_exit_handlers.clear()
        exit_handler._lock_handlers = threading.Lock()  # noqa: SLF001
        telemetry.state_lock = threading.Lock()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        sys.argv = ["flwr-clientapp"]
        run_clientapp(  # ends in flwr_exit (SystemExit), after pushing the reply and the context
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
            parent_pid=spec.parent_pid,
            runtime_dependency_install=spec.runtime_dependency_install,
        )
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            poke(done_fd)  # the reply and the context are in the SuperNode's state by now
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def fedgp_warmup() -> None:
    """One tiny in-process round through fedgp's Flower ClientApp path (``engine=Flower``), so that
    the lazy imports (torch.fx and sympy on the first kernel, numba) and numba's compilation happen
    once, here, not in every forked ClientApp. Single-threaded torch and no tqdm monitor thread, so
    that no extra thread exists when the process forks."""
    import gpytorch
    import torch

    from fedgp.flower.local import Flower
    from fedgp.models import GPSpec
    from fedgp.run import Progress, fit
    from fedgp.strategies import FGPR
    from fedgp.synthetic import gp_federation

    torch.set_num_threads(1)
    try:
        import tqdm

        tqdm.tqdm.monitor_interval = 0
    except ImportError:
        pass
    data = gp_federation(num_clients=2, n=16, d=1, n_test=4, seed=0)
    spec = GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=1)))
    strategy = FGPR(local_steps=1, batch_size=8)
    fit(
        spec,
        data.federation,
        strategy,
        engine=Flower(num_nodes=1),
        rounds=1,
        seed=0,
        callbacks=[Progress(False)],
    )


def _wait_for(address: str, timeout: float = 120.0) -> None:
    host, _, port = address.rpartition(":")
    end = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def superexec(argv: list[str]) -> None:
    """The SuperNode's SuperExec: import and warm up once, then fork a ClientApp per task."""
    parser = argparse.ArgumentParser(prog="python -m fedgp.flower.fast superexec")
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--allow-runtime-dependency-installation", action="store_true")
    parser.add_argument("--task-fd", type=int, help="pipe: a byte when the SuperNode has a task")
    parser.add_argument("--done-fd", type=int, help="pipe: each ClientApp writes a byte as it exits")
    args = parser.parse_args(argv)

    # Pay the imports once: every forked ClientApp starts with them done.
    for name in filter(None, (n.strip() for n in os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD).split(","))):
        importlib.import_module(name)
    warmup = os.environ.get(WARMUP_ENV, DEFAULT_WARMUP)
    if warmup and warmup != "none":
        module, _, function = warmup.partition(":")
        getattr(importlib.import_module(module), function)()
    import flwr.cli.install  # noqa: F401  (what run_clientapp imports and calls)
    import flwr.clientapp.utils  # noqa: F401
    import flwr.supernode.runtime.run_clientapp  # noqa: F401
    from flwr.supercore.superexec import run_superexec as rs

    short_object_pulls()  # the forked ClientApps pull their message from the SuperNode
    _wait_for(args.runtime_api_address)
    if args.task_fd is not None:  # its loop's time.sleep(task_poll_interval): woken by the node
        rs.time = time_with(Wake(args.task_fd).wait)
    if args.done_fd is not None:
        os.set_blocking(args.done_fd, False)
    rs.get_executor = lambda *_, **__: ForkExecutor(args.done_fd)  # its loop, our executor
    rs.run_superexec(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        parent_pid=args.parent_pid,
        runtime_dependency_install=args.allow_runtime_dependency_installation,
    )


#: The names private to Flower this module relies on, (module, attribute): all in Flower 1.41 and
#: 1.42, with the same signatures (1.42 changed only tracing in these modules, in run_superexec).
FLOWER_NAMES = (
    ("flwr.supercore.inflatable.inflatable_utils", "pull_objects"),
    ("flwr.supercore.inflatable.inflatable_utils", "pull_and_inflate_object_from_tree"),
    ("flwr.supernode.start_client_internal", "time"),
    ("flwr.supernode.start_client_internal", "_pull_and_store_message"),
    ("flwr.supernode.start_client_internal", "_push_messages"),
    ("flwr.supercore.superexec.run_superexec", "time"),
    ("flwr.supercore.superexec.run_superexec", "get_executor"),
    ("flwr.supercore.superexec.run_superexec", "run_superexec"),
    ("flwr.supercore.superexec.executor.subprocess_executor", "SubprocessExecutor"),
    ("flwr.supercore.exit.exit_handler", "registered_exit_handlers"),
    ("flwr.supercore.telemetry", "state_lock"),
    ("flwr.supernode.runtime.run_clientapp", "run_clientapp"),
    ("flwr.supernode.cli.flower_supernode", "flower_supernode"),
)


def supported() -> str | None:
    """``None`` when this Flower has every name the fast SuperNode relies on; else what is missing."""
    if not hasattr(os, "fork"):
        return "os.fork (POSIX only)"
    missing = []
    for module, name in FLOWER_NAMES:
        try:
            if not hasattr(importlib.import_module(module), name):
                missing.append(f"{module}.{name}")
        except ImportError:
            missing.append(module)
    return ", ".join(missing) or None


def main(argv: list[str] | None = None) -> None:
    """``python -m fedgp.flower.fast {supernode,superexec} ...`` (``fedgp flower supernode``)."""
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("FEDGP_FLOWER_TRACE") == "1":  # diagnostics: time-stamped Flower log lines
        from flwr.supercore.logger import update_console_handler

        update_console_handler(timestamps=True, colored=False)
    if not argv or argv[0] not in ("supernode", "superexec"):
        raise SystemExit("usage: python -m fedgp.flower.fast {supernode,superexec} ...")
    missing = supported()
    if missing and argv[0] == "supernode":
        reason = f"{_flower_release()} lacks {missing}"
        print(f"fedgp flower supernode: {reason}; running Flower's own SuperNode (flower-supernode) "
              "instead, without the fast path", file=sys.stderr, flush=True)  # fmt: skip
        stock_supernode(argv[1:])
        return
    if missing:  # the SuperExec: only the fast SuperNode starts it, after the same check
        raise SystemExit(f"fedgp flower superexec: {_flower_release()} lacks {missing}")
    {"supernode": supernode, "superexec": superexec}[argv[0]](argv[1:])


def _flower_release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"Flower {version('flwr')}"
    except PackageNotFoundError:
        return "this Flower"


def stock_supernode(argv: list[str]) -> None:
    """Flower's own SuperNode with ``argv``: the ``flower-supernode`` command's entry point, found by
    its (public) name, so a Flower that moved its private modules still runs. ``--isolation`` is
    dropped: the fast path only takes ``process`` (it starts the SuperExec itself), which Flower's own
    SuperNode would leave without one; Flower's default, ``subprocess``, runs the ClientApps."""
    command = _flower_supernode_command()
    if command is None:
        raise SystemExit("fedgp flower supernode: this Flower has no flower-supernode command either")
    sys.argv = ["flower-supernode", *_without_option(argv, "--isolation")]
    command()


def _flower_supernode_command():
    """The ``flower-supernode`` console script's function, or ``None`` in a Flower without one."""
    from importlib.metadata import entry_points

    found = entry_points(group="console_scripts", name="flower-supernode")
    return next(iter(found)).load() if found else None


if __name__ == "__main__":
    main()
