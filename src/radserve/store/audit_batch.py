"""Group commit for audit records that many requests append at once (``phi.read``).

Every read of patient data is audited before its answer is sent, and each append was
its own write transaction: the chain-head row lock, then a commit (on SQLite a WAL
fsync under ``synchronous=FULL``), one read at a time behind the store's audit lock and
the database's write lock that the job writers share. Under a burst of report reads the
reads queued on that lock; the commit, not the work, was the cost.

:class:`AuditBatcher` keeps the rule (the record is committed before the caller goes
on) and shares the commit: callers queue their event and wait on a future; one writer
thread takes everything queued, appends it in order in one transaction
(:meth:`Store.append_audits`) and then resolves every future. Nothing waits on a timer:
a lone read is written at once, and the reads that arrive during a commit share the
next one, so a batch grows only when the database is the bottleneck.

A failing batch is retried one event at a time, so one bad event never refuses the
other reads; when the database is down every caller gets its own error. The store owns
one batcher (:meth:`Store.submit_audit`); its thread starts with the first event and
stops with :meth:`Store.close`.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from radserve.audit.chain import AuditEvent, AuditRecord, canonical_json

if TYPE_CHECKING:
    from radserve.store.access import AccessMixin

logger = logging.getLogger(__name__)

_Item = tuple[AuditEvent, "Future[AuditRecord]"]
MAX_BATCH = 256


class AuditBatcher:
    """Audit appends from many threads or tasks, committed together by one writer."""

    def __init__(self, store: AccessMixin, *, max_batch: int = MAX_BATCH) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.batches = 0  # commits made (for tests and the load bench)
        self.appended = 0

    def submit(self, event: AuditEvent) -> Future[AuditRecord]:
        """Queue ``event``; the future resolves once its record is committed.

        A payload that cannot be stored raises here, for this caller only. Cancelling
        the future before the writer takes it leaves the event unwritten."""
        canonical_json(dict(event.payload))  # JSON-able, or raise now
        future: Future[AuditRecord] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(self._queue,), name="radserve-audit-writer", daemon=True
                )
                self._thread.start()
            self._queue.put((event, future))
        return future

    def commit(self, events: list[AuditEvent]) -> list[Future[AuditRecord]]:
        """Append ``events`` now, in the calling thread, as the writer thread appends a
        batch (one transaction; one by one if it fails, so a bad event refuses only
        itself); a resolved future per event. For a process whose only work is this
        (:mod:`radserve.api.audit_writer`): no thread to hand the batch to."""
        batch: list[_Item] = [(event, Future()) for event in events]
        self._commit(batch)
        return [future for _, future in batch]

    def append(self, event: AuditEvent) -> AuditRecord:
        """:meth:`submit` and wait (for synchronous callers)."""
        return self.submit(event).result()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the writer (a later submit starts a new one,
        on a queue of its own)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(None)
            self._queue = queue.SimpleQueue()
        thread.join(timeout)

    # -- the writer ------------------------------------------------------------------

    def _run(self, items: queue.SimpleQueue[_Item | None]) -> None:
        stopping = False
        while not stopping:
            item = items.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    more = items.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                batch.append(more)
            self._commit(batch)

    def _commit(self, batch: list[_Item]) -> None:
        live = [(event, future) for event, future in batch if future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            records = self.store.append_audits([event for event, _ in live])
        except Exception as exc:
            if len(live) == 1:
                live[0][1].set_exception(exc)
                return
            logger.warning("audit batch of %d failed (%s); appending one by one", len(live), exc)
            for event, future in live:
                self._one(event, future)
            return
        self.batches += 1
        self.appended += len(records)
        for (_, future), record in zip(live, records, strict=True):
            future.set_result(record)

    def _one(self, event: AuditEvent, future: Future[AuditRecord]) -> None:
        try:
            record = self.store.append_audit(event)
        except Exception as exc:
            future.set_exception(exc)
            return
        self.batches += 1
        self.appended += 1
        future.set_result(record)


__all__ = ["MAX_BATCH", "AuditBatcher"]
