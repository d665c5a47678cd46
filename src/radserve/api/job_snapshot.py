"""What only the serving process knows about jobs, published for the API reader processes.

A job's status answer carries its queue position and ETA, which live in the scheduler
of the serving process. That process writes the views (:class:`JobView`) of its waiting
and running jobs, and of the ones that finished lately, to one file, replaced atomically
at most every ``interval_s`` after a job changes (and every ``refresh_s`` for the ETAs);
a reader process checks the file's identity (one ``stat``, at most every 10 ms) and
loads it when it changed. A job not in the file is read from the store.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from collections import OrderedDict
from pathlib import Path

from radserve import durable
from radserve.service.job_view import JobView
from radserve.service.jobcache import JobCache
from radserve.service.jobs import JobAccess
from radserve.store import JobRecord

logger = logging.getLogger(__name__)

_FINISHED_KEPT = 1024  # finished jobs kept in the file (the most recent ones)


class SnapshotWriter:
    """The serving process's side: follows the job cache, writes the file."""

    def __init__(
        self,
        jobs: JobAccess,
        cache: JobCache,
        path: Path,
        *,
        interval_s: float = 0.05,
        refresh_s: float = 1.0,
    ) -> None:
        self.jobs = jobs
        self.path = path
        self.interval_s = interval_s
        self.refresh_s = refresh_s
        self._active: dict[str, JobRecord] = {}
        self._finished: OrderedDict[str, JobRecord] = OrderedDict()
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for record in cache.records():
            self._note(record)
        cache.subscribe(self._note)
        self.written = 0

    def _note(self, record: JobRecord) -> None:
        with self._lock:
            if record.terminal:
                self._active.pop(record.id, None)
                self._finished[record.id] = record
                self._finished.move_to_end(record.id)
                while len(self._finished) > _FINISHED_KEPT:
                    self._finished.popitem(last=False)
            else:
                self._active[record.id] = record
        self._changed.set()

    def write(self) -> None:
        """Write the file now (atomically: readers see the old one or the new one)."""
        with self._lock:
            active = list(self._active.values())
            finished = list(self._finished.values())
        views = {r.id: JobView(r, None) for r in finished}
        views.update((r.id, self.jobs.view(r)) for r in active)
        # no fsync: the file is rewritten within ``interval_s`` of every change and again
        # at start from the store and the scheduler, so a power cut loses nothing that
        # two device flushes per write (up to 20 a second) would have kept
        durable.write_bytes(
            self.path, pickle.dumps(views, protocol=pickle.HIGHEST_PROTOCOL), sync=False
        )
        self.written += 1

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._run, name="job-snapshot", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._changed.wait(self.refresh_s)
            self._changed.clear()
            if self._stop.is_set():
                return
            try:
                self.write()
            except Exception:  # a failed write leaves the last file; the next one retries
                logger.exception("could not write the job snapshot")
            self._stop.wait(self.interval_s)


class SnapshotReader:
    """A reader process's side: the last file written, reloaded when it changes."""

    def __init__(self, path: Path, *, recheck_s: float = 0.01) -> None:
        self.path = path
        self.recheck_s = recheck_s
        self._checked = -recheck_s
        self._identity: tuple[int, int] | None = None
        self._views: dict[str, JobView] = {}

    def get(self, job_id: str) -> JobView | None:
        now = time.monotonic()
        if now - self._checked < self.recheck_s:  # a stat per request cost ~0.1 ms
            return self._views.get(job_id)
        self._checked = now
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        identity = (stat.st_ino, stat.st_mtime_ns)  # os.replace: a new inode each time
        if identity != self._identity:
            try:
                self._views = pickle.loads(self.path.read_bytes())
            except FileNotFoundError:  # replaced again meanwhile: the next read loads it
                return self._views.get(job_id)
            self._identity = identity
        return self._views.get(job_id)


__all__ = ["SnapshotReader", "SnapshotWriter"]
