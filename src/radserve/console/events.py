"""Live job changes for the console's worklist (server-sent events).

Every record the job cache receives (intake, scheduler hooks, cancellation: each after
its commit) is numbered and kept in a bounded ring, and each open stream is woken. A
stream sends the changes after the ``Last-Event-ID`` its browser reconnected with; if
those have left the ring it sends ``reset`` and the page reloads its list once. Streams
end after ``STREAM_S`` (the browser reconnects at once, losing nothing), so a server
stopping never waits long for an open console.

A ``waiting`` event (:class:`WaitingEvents`) says what blocks all of this server's work
(every Ray worker lost, new work held: the API's ``waiting_for``) when that changes: no
job's record changes then, so no ``job`` event would tell the worklist.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import threading
from collections import deque
from collections.abc import Callable

from radserve.service.job_view import JobWait
from radserve.store import JobRecord

RING = 2000
STREAM_S = 20.0


class JobFeed:
    """Numbered job changes; thread-safe producers, asyncio consumers."""

    def __init__(self, ring: int = RING) -> None:
        self._ring: deque[tuple[int, JobRecord]] = deque(maxlen=ring)
        self._seq = 0
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def publish(self, record: JobRecord) -> None:
        """Called on the writer's thread (see :meth:`JobCache.subscribe`)."""
        with self._lock:
            self._seq += 1
            self._ring.append((self._seq, record))
            waiters = tuple(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)

    @property
    def seq(self) -> int:
        with self._lock:
            return self._seq

    def after(self, seq: int) -> list[tuple[int, JobRecord]] | None:
        """Changes numbered above ``seq``; None when some of them were dropped."""
        with self._lock:
            if seq > self._seq:
                return None  # a number from a previous server run
            if self._ring and seq < self._ring[0][0] - 1:
                return None
            if not self._ring and seq < self._seq:
                return None
            return [(n, r) for n, r in self._ring if n > seq]

    def waiter(self) -> tuple[asyncio.Event, Callable[[], None]]:
        """An event set on every change, and the function that unregisters it."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(entry)

        def close() -> None:
            with self._lock:
                self._waiters.discard(entry)

        return entry[1], close


class WaitingEvents:
    """One stream's ``waiting`` events: the first time, then whenever the block's reason
    or start changes (its message may name a running count of seconds: not a change)."""

    def __init__(self) -> None:
        self._sent: tuple[str, str] | None = None
        self._first = True

    def event(self, wait: JobWait | None) -> bytes | None:
        """The event to send for ``wait`` (:attr:`JobAccess.waits_for`), or None."""
        body = None
        if wait is not None:
            since = wait.since.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = {"reason": wait.reason, "message": wait.message, "since": since}
        key = None if body is None else (body["reason"], body["since"])
        if not self._first and key == self._sent:
            return None
        self._first, self._sent = False, key
        return f"event: waiting\ndata: {json.dumps(body)}\n\n".encode()


__all__ = ["RING", "STREAM_S", "JobFeed", "WaitingEvents"]
