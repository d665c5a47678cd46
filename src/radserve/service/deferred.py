"""Job-progress writes held back while the database does not answer, written in order
once it does.

A job's state change (running, its result and deliveries, failed, cancelled) is written
with ~2 minutes of retries (``jobs.store_outage_wait_s``). An outage
longer than that used to leave the store behind what happened for good: a job that ran
stayed ``queued`` or ``running`` in the store while this replica kept renewing its lease,
so no other replica took it over and it finished only at the next restart. Now the event
is held here instead, per job and in order (a later event of the same job never
overtakes a held one), and one thread writes the held events as soon as the database
answers. While anything is held the database is known to be down, so new writes try
once and join the queue instead of blocking the scheduler's event thread for minutes.

Memory is bounded by the jobs in flight: a job emits at most a handful of events.
If the process stops with events held, those jobs are unfinished in the store and run
again at the next start (restart recovery), or on another replica when their lease
runs out.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from radserve.scheduling import JobEvent
from radserve.store.errors import DatabaseUnavailableError

logger = logging.getLogger(__name__)

RETRY_EVERY_S = 2.0


class DeferredWrites:
    """Held job events (job id -> its events in order) and the thread that writes them."""

    def __init__(
        self, apply: Callable[[JobEvent], None], *, retry_every_s: float = RETRY_EVERY_S
    ) -> None:
        self._apply = apply
        self.retry_every_s = retry_every_s
        self._held: OrderedDict[str, list[JobEvent]] = OrderedDict()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """Something is held: the database did not answer the last time it was asked."""
        return bool(self._held)

    def held_jobs(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def held(self) -> dict[str, list[str]]:
        """Job id -> the states whose write is held, in order (for operators and tests)."""
        with self._lock:
            return {job: [e.state.value for e in events] for job, events in self._held.items()}

    def hold_if_behind(self, event: JobEvent) -> bool:
        """Queue ``event`` behind its job's held events, if it has any (keeps its order)."""
        with self._lock:
            events = self._held.get(event.job_id)
            if events is None:
                return False
            events.append(event)
            return True

    def hold(self, event: JobEvent, reason: DatabaseUnavailableError) -> None:
        """The write of ``event`` was given up: hold it until the database answers."""
        with self._lock:
            self._held.setdefault(event.job_id, []).append(event)
            held = len(self._held)
        logger.error(
            "job %s: its %s could not be written (%s); held until the database answers "
            "(%d job(s) held)",
            event.job_id,
            event.state.value,
            reason.code,
            held,
        )
        self._ensure_thread()
        self._wake.set()

    def flush(self) -> bool:
        """Write what is held, job by job and in order; stops at the first write the
        database does not take. Returns whether nothing is held any more."""
        for job_id in self.held_jobs():
            while True:
                with self._lock:
                    events = self._held.get(job_id)
                    if not events:
                        self._held.pop(job_id, None)
                        break
                    event = events[0]
                try:
                    self._apply(event)
                except DatabaseUnavailableError:
                    return False
                except Exception:  # written or refused: either way it is not held again
                    logger.exception("job %s: a held %s write failed", job_id, event.state.value)
                else:
                    logger.warning("job %s: held %s written", job_id, event.state.value)
                with self._lock:
                    events.pop(0)
        return not self.active

    def stop(self, timeout_s: float = 10.0) -> None:
        """Try once more, then stop; what is still held runs again at the next start."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=timeout_s)
        if self.active:
            logger.error(
                "stopping with %d job(s) whose progress could not be written; they run "
                "again at the next start",
                len(self._held),
            )

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None:  # it checks for more before it ends
                return
            self._thread = threading.Thread(
                target=self._run, name="radserve-deferred-writes", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.retry_every_s)
            self._wake.clear()
            self.flush()
            with self._lock:  # a hold after this starts a new thread
                if self._stop.is_set() or not self._held:
                    self._thread = None
                    return


__all__ = ["DeferredWrites"]
