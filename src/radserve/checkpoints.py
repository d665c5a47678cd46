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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

Waiter = Callable[[], None]

_WAITER: ContextVar[Waiter | None] = ContextVar("radserve_checkpoint_waiter", default=None)


def checkpoint() -> None:
    """Let more urgent work pass here, if this thread runs routine work (may block)."""
    wait = _WAITER.get()
    if wait is not None:
        wait()


@contextmanager
def yielding_to(wait: Waiter | None) -> Iterator[None]:
    """Run the block with ``wait`` called at every :func:`checkpoint` (None: never)."""
    token = _WAITER.set(wait)
    try:
        yield
    finally:
        _WAITER.reset(token)


def carry(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, bound to the calling thread's waiter, for a thread pool to run."""
    wait = _WAITER.get()
    if wait is None:
        return fn

    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        with yielding_to(wait):
            return fn(*args, **kwargs)

    return bound


__all__ = ["Waiter", "carry", "checkpoint", "yielding_to"]
