"""Slices of a volume that is still being decoded: which are in place, and waiting for them.

JPEG 2000 decoding costs more CPU than the whole pipeline's other work on the bench CT
(docs/performance.md). When the caller asks for it, :func:`radserve.ingest.load_series`
returns the volume while its decoder processes are still filling it, with a
:class:`SliceArrival`; readers wait for the slices they need instead of for the whole
stack, so the organ model can start on the first slabs while the rest decode.

Readers must call :meth:`SliceArrival.wait` (some slices) or :meth:`wait_all` before
they read the array: a slice not yet marked holds uninitialised memory.

A run that ends before the stack is in place (cancelled, failed, shut down) abandons it
(:meth:`SliceArrival.abandon`, or the cancel event it :meth:`watches
<SliceArrival.watch>`): the decoder hands its processes no more of this stack, drops what
is in flight and stops (:meth:`SliceArrival.wait_stopped`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np

from radserve.errors import DecodeError


class DecodeAbandonedError(DecodeError):
    """A streamed stack's decoding stopped because its reader's run ended."""


class SliceArrival:
    """Which of ``n`` slices are decoded; a decoding failure is re-raised to waiters."""

    def __init__(self, n: int) -> None:
        self._done = np.zeros(n, dtype=bool)
        self._left = n
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._abandoned = False
        self._cancel: threading.Event | None = None
        self._stopped = threading.Event()  # the decoder is done with this stack

    @property
    def abandoned(self) -> bool:
        """Nobody will read the rest: :meth:`abandon` was called, or the watched cancel
        event is set. The decoder polls this between tasks."""
        cancel = self._cancel
        return self._abandoned or (cancel is not None and cancel.is_set())

    def watch(self, cancel: threading.Event | None) -> None:
        """Abandon the stack once ``cancel`` is set (a job cancelled, a server stopping)."""
        self._cancel = cancel

    def abandon(self, error: BaseException | None = None) -> None:
        """The run reading this stack ended: decode no more of it. Waiters (and later
        readers) raise ``error`` (default: a :class:`DecodeAbandonedError`) unless the
        decode failed or completed already."""
        with self._cond:
            self._abandoned = True
            if self._error is None and self._left:
                self._error = error or DecodeAbandonedError(
                    "the run reading this stack ended; its decoding was abandoned"
                )
            self._cond.notify_all()

    def stopped(self) -> None:
        """Called by the decoder when it hands out and copies nothing more."""
        self._stopped.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until the decoder is done with this stack; False on timeout."""
        return self._stopped.wait(timeout)

    @property
    def complete(self) -> bool:
        """Every slice is in place (a failed decode is never complete)."""
        with self._cond:
            return self._left == 0 and self._error is None

    def mark(self, slices: Iterable[int]) -> None:
        """Slices ``slices`` are in place (called by the decoding thread)."""
        with self._cond:
            for k in slices:
                if not self._done[k]:
                    self._done[k] = True
                    self._left -= 1
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The decode stopped: every waiter, now and later, raises ``error``."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def wait(self, slices: Iterable[int]) -> None:
        """Block until ``slices`` are in place; raise the decode's error if it failed."""
        wanted = np.fromiter(slices, dtype=np.intp)
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._done[wanted].all():
                    return
                self._cond.wait()

    def wait_range(self, start: int, stop: int) -> None:
        """:meth:`wait` for slices ``start..stop-1``."""
        self.wait(range(max(0, start), min(len(self._done), stop)))

    def wait_all(self) -> None:
        """Block until the whole stack is in place (or raise the decode's error)."""
        with self._cond:
            while self._left and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error


__all__ = ["DecodeAbandonedError", "SliceArrival"]
