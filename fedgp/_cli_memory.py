"""The command line out of memory: one line naming the address-space limit (``ulimit -v``) and what to
change, exit status :data:`OUT_OF_MEMORY`, never a traceback from deep inside PyTorch (issue 51)."""

from __future__ import annotations

__all__ = ["OUT_OF_MEMORY", "MIN_ADDRESS_SPACE", "out_of_memory", "memory_advice", "libraries_under_limit"]

#: The exit status of a command that ran out of memory (said in one line, without a traceback).
OUT_OF_MEMORY = 3

#: The least address space (``ulimit -v``) a computing command starts under: PyTorch, GPyTorch and
#: numba map about 1 GiB as they load (Linux x86-64, 2026-12); under less, an import fails deep inside
#: them (or a C++ library aborts the process), so the command refuses first, in one line.
MIN_ADDRESS_SPACE = 2**30

#: How torch words a C++ allocation that failed (``std::bad_alloc`` becomes a ``RuntimeError``).
_ALLOCATION_FAILED = ("bad_alloc", "can't allocate memory", "not enough memory", "out of memory")


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says an allocation failed: a ``MemoryError``, or torch's ``RuntimeError`` for a
    C++ ``std::bad_alloc`` (``DefaultCPUAllocator: can't allocate memory``, CUDA's out of memory)."""
    if isinstance(err, MemoryError):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err).lower() for text in _ALLOCATION_FAILED)


def _address_limit() -> int | None:
    """The process's address-space limit in bytes (``ulimit -v``), or ``None`` when there is none."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):  # no resource module (Windows): no limit to name
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def libraries_under_limit(command: str) -> str | None:
    """Load the libraries a computing command needs (PyTorch, GPyTorch, numba) up front: under an
    address-space limit too small for them, their imports fail in many ways (``failed to map
    segment``, ``SystemError``, a library "not found"), each a traceback deep inside them. Returns
    the one line to say instead, or ``None`` when they loaded (or failed without a limit: re-raised)."""
    if command not in ("fit", "predict", "demo", "reproduce"):
        return None
    limit = _address_limit()
    if limit is not None and limit < MIN_ADDRESS_SPACE:  # below it a library may abort the process
        return (
            f"this process may use {limit / 2**30:.2f} GiB of address space (ulimit -v), less than the "
            f"{MIN_ADDRESS_SPACE / 2**30:.0f} GiB that loading PyTorch and its libraries takes: raise the "
            "limit"
        )
    try:
        import gpytorch  # noqa: F401
        import torch  # noqa: F401

        import fedgp.engines.compiled  # noqa: F401 - numba, where installed
    except Exception as err:
        if limit is None:
            raise
        return (
            f"cannot load PyTorch and its libraries within this process's address-space limit of "
            f"{limit / 2**30:.2f} GiB (ulimit -v; {_first_line(err)[:100]}): raise the limit (a few GiB)"
        )
    return None


def memory_advice(err: BaseException) -> str:
    """One line for a command that ran out of memory: the limit it ran under and what to change."""
    soft = _address_limit()
    limit = (
        f"this process may use {soft / 2**30:.2f} GiB of address space (ulimit -v)"
        if soft is not None
        else "the machine has no memory left for it"
    )
    detail = _first_line(err)
    return (
        f"out of memory ({detail[:120]}): {limit}. Raise the limit, or give the command fewer owners "
        "at once (split the table by owner and fit each part)"
    )


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
