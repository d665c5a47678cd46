"""A sweep of leftover files run in a daemon thread: at start and every ``every_s``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from radserve.loop_failures import LoopFailures
from radserve.store import Store


class PeriodicSweep:
    """Calls :meth:`sweep` at start and every ``every_s`` until :meth:`stop`; a round that
    fails (the database away) is logged as a loop's failures are, and the next one tries
    again. Subclasses name the sweep (``what``, ``thread_name``, ``log``)."""

    what = "sweeping"
    thread_name = "radserve-sweep"
    log = logging.getLogger(__name__)

    def __init__(
        self,
        store: Store,
        *,
        grace_s: float,
        every_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.grace_s = grace_s  # what a subclass leaves alone while it may still be in use
        self.every_s = every_s
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> object:
        """One round."""
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        failures = LoopFailures(self.log, self.what)
        while not self._stop.is_set():
            try:
                self.sweep()
            except Exception as exc:  # the database away: the next round tries again
                failures.failed(exc)
            else:
                failures.succeeded()
            self._stop.wait(self.every_s)


__all__ = ["PeriodicSweep"]
