"""One thread that takes everything queued since its last round at once: group commit.

Whoever queues while a round runs shares the next round, so N writers pay for one flush
or one database commit instead of N. Used by the gateway's instance store (fsync of
received instances, :class:`radserve.gateway.storage.GroupCommitter`) and the critical
push (recording receivers' answers, :class:`radserve.critical.push.CriticalOutbox`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class BatchWorker(Generic[T]):
    """``handle(batch)`` on one daemon thread, for every item :meth:`put` in order, in
    batches of whatever waited. ``handle`` must not raise: what it cannot do it records
    on the items (the thread would end and later items wait forever)."""

    def __init__(self, handle: Callable[[list[T]], None], *, name: str) -> None:
        self._handle = handle
        self._queue: list[T] = []
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: T) -> bool:
        """Queue ``item`` for the next round; False (nothing queued) once closed."""
        with self._ready:
            if self._closed:
                return False
            self._queue.append(item)
            self._ready.notify()
        return True

    def close(self, timeout: float | None = None) -> None:
        """Refuse new items, hand every queued one to ``handle``, end the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                batch, self._queue = self._queue, []
            if not batch:
                return  # closed, and everything handed over
            self._handle(batch)


__all__ = ["BatchWorker"]
