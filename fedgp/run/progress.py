"""Progress over rounds, repeats and tasks: a tqdm bar on a terminal, whole lines in a log.

Every long loop in fedgp takes ``progress``:

* ``None`` (the library's default): a tqdm bar when stderr is a terminal, nothing otherwise;
* ``True``: the same bar on a terminal, and when stderr is not one (a log file, a CI job, a pipe)
  one line every ``every`` steps (default: a tenth of the loop) instead of a bar redrawn with
  carriage returns, which a log shows as one ever-growing line or not at all;
* ``False``: nothing.

The lines come from tqdm itself (:class:`LineProgress` is a ``tqdm`` whose display writes a line),
so the figures in them (count, elapsed, remaining, rate, postfix such as ``train_nll``) are tqdm's.

A loop that ends before its total because it is done (a stopping rule held after round 12 of a
100-round budget) calls :func:`end_early`: the total becomes the count reached, so the display
ends at ``12/12``, 100 %, not at ``12/100`` as if it had been cut off.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

from fedgp.errors import InputError

__all__ = ["progress_bar", "LineProgress", "end_early"]

#: Lines are at least this many seconds apart, so short loops (many quick fits) stay quiet.
MIN_SECONDS = 1.0


class LineProgress(tqdm):
    """A tqdm that writes one line every ``every`` steps (and one at the end) instead of a bar.

    ``every`` defaults to a tenth of ``total`` (every step when the total is unknown). A line is
    skipped when the previous one (or the start) is less than ``min_seconds`` (default
    :data:`MIN_SECONDS`) old; the closing line is written only if the loop wrote a line before or
    ran for ``min_seconds``.
    """

    def __init__(
        self,
        iterable: Iterable | None = None,
        *args: Any,
        every: int | None = None,
        min_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.update(mininterval=0, miniters=1, disable=False)
        kwargs.setdefault("file", sys.stderr)
        sized = kwargs.get("total") is not None or hasattr(iterable, "__len__")
        kwargs.setdefault(
            "bar_format",
            "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
            if sized
            else "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]",
        )
        self._printed = None  # the count of the last line written (None: none yet)
        self._printed_total = None  # the total that line showed
        self._wrote = False
        super().__init__(iterable, *args, **kwargs)
        self._line_t = self.start_t
        if every is not None and (not isinstance(every, int) or every < 1):
            raise InputError(f"every must be a positive int, got {every!r}")
        self.every = every or (max(1, math.ceil(self.total / 10)) if self.total else 1)
        self.min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
        self._printed = self.n  # a resumed loop (initial > 0) does not report its start
        self._printed_total = self.total

    def _line(self) -> None:
        self.fp.write(self.format_meter(**self.format_dict) + "\n")
        self.fp.flush()
        self._printed, self._printed_total, self._line_t, self._wrote = self.n, self.total, time.time(), True

    def _stale(self) -> bool:
        """Whether the last line shows another count or total than now (:func:`end_early`)."""
        return self.n != self._printed or self.total != self._printed_total

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg is not None or self._printed is None:  # tqdm clearing its bar, or not set up yet
            return True
        due = self._stale() and (self.n % self.every == 0 or self.n == self.total)
        if due and time.time() - self._line_t >= self.min_seconds:
            self._line()
        return True

    def close(self) -> None:
        if not self.disable and self._printed is not None and self._stale():
            if self._wrote or time.time() - self.start_t >= self.min_seconds:
                self._line()
        # tqdm's close would now clear or finish a bar with "\r" / "\n"; without its status
        # printer (``sp``, None for tqdm's GUI subclasses too) it only unregisters the instance.
        self.sp = None
        super().close()


def progress_bar(
    iterable: Iterable | None = None,
    *,
    progress: bool | None,
    desc: str,
    total: int | None = None,
    initial: int = 0,
    leave: bool = False,
    every: int | None = None,
    **kwargs: Any,
) -> tqdm:
    """The progress display of a loop (see the module docstring for ``progress``)."""
    if progress is True and not _is_terminal(kwargs.get("file", sys.stderr)):
        return LineProgress(iterable, desc=desc, total=total, initial=initial, every=every, **kwargs)
    disable = None if progress is None else not progress
    return tqdm(iterable, desc=desc, total=total, initial=initial, leave=leave, disable=disable, **kwargs)


def end_early(bar: tqdm) -> None:
    """``bar``'s loop is done before its total (a stopping rule held): make the count reached the
    total, so that the bar, or :class:`LineProgress`'s last line, ends at 100 %. Call it before
    ``close``; a disabled bar is left alone."""
    if bar.disable:
        return
    bar.total = bar.n
    bar.refresh()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
