"""The last known record of recent jobs, in memory, so status reads need no database
round trip.

Every writer of a job row in this process (intake, the scheduler hooks, cancellation)
puts the record the store returned here *after* the commit, so the cache is never ahead
of the database; a miss (an old job, or one evicted) falls back to the store. This holds
for the jobs this process's scheduler runs and for finished ones; an unfinished job it
does not run (replicas: another may have taken it over) is read from the store
(:meth:`radserve.service.jobs.JobAccess.cached`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from radserve.store import JobRecord

logger = logging.getLogger(__name__)


class JobCache:
    """A bounded LRU of ``JobRecord`` by job id; thread-safe."""

    def __init__(self, capacity: int = 20_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[str, JobRecord] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        # called with each record put here (after its commit): the console's live worklist
        self._listeners: list[Callable[[JobRecord], None]] = []

    def subscribe(self, listener: Callable[[JobRecord], None]) -> None:
        """Call ``listener(record)`` for every newer record put here (on the writer's
        thread; it must be quick and must not raise)."""
        with self._lock:
            self._listeners.append(listener)

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            record = self._items.get(job_id)
            if record is None:
                self.misses += 1
                return None
            self._items.move_to_end(job_id)
            self.hits += 1
            return record

    def put(self, record: JobRecord) -> None:
        """Remember ``record`` unless a newer one (by ``updated``) is already here."""
        with self._lock:
            current = self._items.get(record.id)
            if (
                current is not None
                and current.updated is not None
                and record.updated is not None
                and record.updated < current.updated
            ):
                return
            self._items[record.id] = record
            self._items.move_to_end(record.id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
            listeners = tuple(self._listeners)
        for listener in listeners:
            try:
                listener(record)
            except Exception:  # a listener never breaks a job's write path
                logger.exception("job cache listener failed")

    def records(self) -> list[JobRecord]:
        """Every record held now (oldest use first)."""
        with self._lock:
            return list(self._items.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


__all__ = ["JobCache"]
