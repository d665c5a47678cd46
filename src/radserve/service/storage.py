"""Whether the data folder can be written: the readiness probe for shared storage.

In a cluster ``data_dir`` is shared storage (NFS, a mounted object store). When it goes
away (read-only, full, unmounted, or hung), uploads and C-STOREs can no longer be stored
durably, so they are refused (503 ``storage_unavailable``, nothing acknowledged), and the
server must stop saying it is ready so that a load balancer sends work elsewhere.

A daemon thread writes, fsyncs and removes a small file under ``data_dir/.probe/``
every ``storage.probe_interval_s``. Each probe runs on a thread of its own and is
given ``storage.probe_timeout_s``: a write into a hung NFS mount never returns, and
must not stall the prober or ``/readyz``. While a probe is stuck, no other is started
and the storage counts as unavailable. A writer that fails reports it at once
(:meth:`StorageProbe.report`). With ``storage.fallback_dir`` the server stays ready and
writes locally meanwhile (:mod:`radserve.service.failover`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from radserve.loop_failures import LoopFailures

logger = logging.getLogger(__name__)

PROBE_DIR = ".probe"


class StorageProbe:
    def __init__(
        self,
        data_dir: Path,
        *,
        interval_s: float,
        timeout_s: float,
        on_healthy: Callable[[], object] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        # called after each probe that succeeds (the fallback's reconcile)
        self.on_healthy = on_healthy
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._problem: str | None = None  # why the folder cannot be written; None: it can
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stuck: threading.Thread | None = None  # a probe that never returned

    @property
    def problem(self) -> str | None:
        """Why the data folder cannot be written now, or ``None``."""
        with self._lock:
            return self._problem

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="radserve-storage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def report(self, why: str) -> None:
        """A write into the data folder failed (seen by its writer): unavailable now,
        until the next probe succeeds."""
        self._set(why)

    def probe(self) -> str | None:
        """One probe now; its outcome (also kept for :attr:`problem`)."""
        if self._stuck is not None and self._stuck.is_alive():
            why: str | None = f"a write has not returned for over {self.timeout_s:.0f} s"
        else:
            outcome: list[str | None] = []
            worker = threading.Thread(
                target=lambda: outcome.append(_write_probe(self.data_dir)),
                name="radserve-storage-probe",
                daemon=True,
            )
            worker.start()
            worker.join(self.timeout_s)
            if worker.is_alive():
                self._stuck = worker
                why = f"a write did not return within {self.timeout_s:.0f} s"
            else:
                self._stuck = None
                why = outcome[0]
        self._set(why)
        return why

    def _set(self, why: str | None) -> None:
        with self._lock:
            was, self._problem = self._problem, why
            if (was is None) == (why is None):
                return
            held = time.monotonic() - self._since
            self._since = time.monotonic()
        if why is not None:
            logger.error("storage: the data folder cannot be written (%s): not ready", why)
        else:
            logger.warning("storage: the data folder is writable again after %.1f s", held)

    def _run(self) -> None:
        failures = LoopFailures(logger, "storage: probe and reconcile")
        while not self._stop.is_set():
            try:
                if self.probe() is None and self.on_healthy is not None:
                    self.on_healthy()
            except Exception as exc:  # the prober must outlive any one probe
                failures.failed(exc)
            else:
                failures.succeeded()
            self._stop.wait(self.interval_s)


def _write_probe(data_dir: Path) -> str | None:
    """Write, fsync and remove one small file; the errno name if any step fails."""
    try:
        folder = data_dir / PROBE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        # unique across replicas sharing the folder (pids repeat across hosts)
        path = folder / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        with open(path, "wb") as handle:
            handle.write(b"radserve storage probe\n")
            handle.flush()
            os.fsync(handle.fileno())
        path.unlink()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return None


__all__ = ["PROBE_DIR", "StorageProbe"]
