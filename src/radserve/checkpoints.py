"""Yield points in long CPU stages, where routine work lets urgent work pass.

The scheduler hands out work at stage and batch boundaries, but a routine study's CPU
stage already running (reading 300 headers, decoding its slices, writing its label
maps) keeps its cores until it ends. Stages are synchronous code that knows nothing of
priorities, so they call :func:`checkpoint` between pieces of work that hold no shared
lock (each file's header, each decoding job, each label map written), and nothing else.
The executor that runs a *routine* job's stage installs a waiter with
:func:`yielding_to`; at a checkpoint the waiter blocks while an URGENT job is
unfinished (``scheduler.yield_to_urgent``). Work of an URGENT job, and any code run
outside an executor (the CLI, tests), has no waiter: a checkpoint is then one context
variable read.

Threads that a stage starts for itself do not inherit its context: :func:`carry` binds
a callable to the caller's waiter before it is handed to a pool.

A paused stage's wall time is not its work: the executor hands each routine unit a
:class:`PauseLog`, every wait at a checkpoint is recorded in it, and
:class:`~radserve.progress.StageTimer` and the scheduler read back how much of a stage,
or of the unit, was spent paused (:func:`paused_within`), so a timing that includes a
pause says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

Waiter = Callable[[], None]

# a wait shorter than this is the gate found open, not a pause
_MIN_PAUSE_S = 1e-3


class PauseLog:
    """The spans (``time.perf_counter`` seconds) in which one unit's threads waited at
    checkpoints. The unit's own thread and the pools it started wait on the same gate,
    so their spans overlap; :meth:`within` counts their union once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[float, float]] = []

    def add(self, start: float, end: float) -> None:
        if end - start >= _MIN_PAUSE_S:
            with self._lock:
                self._spans.append((start, end))

    def within(self, start: float = float("-inf"), end: float = float("inf")) -> float:
        """Seconds of ``[start, end]`` in which at least one thread was paused."""
        with self._lock:
            spans = sorted(self._spans)
        total, reach = 0.0, start
        for lo, hi in spans:
            lo, hi = max(lo, reach), min(hi, end)
            if hi > lo:
                total += hi - lo
                reach = hi
        return total


_WAITER: ContextVar[Waiter | None] = ContextVar("radserve_checkpoint_waiter", default=None)
_PAUSES: ContextVar[PauseLog | None] = ContextVar("radserve_checkpoint_pauses", default=None)


def checkpoint() -> None:
    """Let more urgent work pass here, if this thread runs routine work (may block)."""
    wait = _WAITER.get()
    if wait is None:
        return
    log = _PAUSES.get()
    if log is None:
        wait()
        return
    start = time.perf_counter()
    try:
        wait()
    finally:
        log.add(start, time.perf_counter())


def paused_within(start: float, end: float) -> float:
    """Seconds of ``[start, end]`` (``time.perf_counter``) that this context's unit spent
    paused at checkpoints; 0 outside an executor's routine unit."""
    log = _PAUSES.get()
    return 0.0 if log is None else log.within(start, end)


@contextmanager
def yielding_to(wait: Waiter | None, log: PauseLog | None = None) -> Iterator[None]:
    """Run the block with ``wait`` called at every :func:`checkpoint` (None: never),
    each wait recorded in ``log``."""
    token = _WAITER.set(wait)
    log_token = _PAUSES.set(log if wait is not None else None)
    try:
        yield
    finally:
        _PAUSES.reset(log_token)
        _WAITER.reset(token)


def carry(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, bound to the calling thread's waiter (and pause log), for a thread pool
    to run."""
    wait = _WAITER.get()
    if wait is None:
        return fn
    log = _PAUSES.get()

    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        with yielding_to(wait, log):
            return fn(*args, **kwargs)

    return bound


__all__ = ["PauseLog", "Waiter", "carry", "checkpoint", "paused_within", "yielding_to"]
