"""Executors run what the scheduler dispatches: here, threads of this process.

:class:`InProcessExecutor` runs one worker thread per device (CPU inference counts as
one device) with a feeder thread beside it (batch preparation and merging only, as
:func:`~radserve.inference.runner.run_task_overlapped` does for one study), a CPU pool
for ingest, post-processing and reports (and feeding when free), an URGENT lane (one
CPU thread that only takes URGENT work) and a watchdog that ticks the scheduler at
least once a second. A cluster executor (Ray actors per GPU) implements the same
:class:`Executor` protocol over the same :class:`~radserve.scheduling.core.Scheduler`.
:func:`run_serial` runs everything on the calling thread, deterministically, for tests
and tools.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from radserve.scheduling.core import Scheduler
from radserve.scheduling.dispatch import Dispatch, execute

logger = logging.getLogger(__name__)


class Executor(Protocol):
    """Pulls work from a scheduler and runs it until stopped."""

    def start(self) -> None: ...

    def stop(self, *, wait: bool = True) -> None: ...


class InProcessExecutor:
    """Worker threads in this process, driving one :class:`Scheduler`.

    ``stop`` lets every unit already running finish (a batch boundary) and leaves
    unfinished jobs in the scheduler: the service resubmits them after a restart.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        devices: Sequence[str] = ("cpu",),
        cpu_workers: int = 2,
        urgent_lane: bool = True,
        watchdog_interval_s: float = 0.5,
        idle_wait_s: float = 1.0,
    ) -> None:
        if not devices:
            raise ValueError("an executor needs at least one device (use 'cpu' for CPU-only)")
        if cpu_workers < 1:
            raise ValueError(f"cpu_workers must be >= 1, got {cpu_workers}")
        if not 0 < watchdog_interval_s <= 1.0:
            raise ValueError(
                f"watchdog_interval_s must be in (0, 1] so deadline misses are seen within a "
                f"second, got {watchdog_interval_s}"
            )
        self.scheduler = scheduler
        self.devices = tuple(devices)
        self.cpu_workers = cpu_workers
        self.urgent_lane = urgent_lane
        self.watchdog_interval_s = watchdog_interval_s
        # Workers are woken by every scheduler change; the timeout is only a safety net,
        # except while a batch is held for dynamic batching.
        self._idle_wait_s = idle_wait_s
        self._hold_wait_s = scheduler.config.max_queue_delay_s or idle_wait_s
        self._cond = threading.Condition()
        self._generation = 0
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("executor already started")
        self._stopping.clear()
        self.scheduler.add_listener(self._wake)
        sched = self.scheduler
        loops: list[tuple[str, Callable[[], Dispatch | None]]] = []
        for device in self.devices:
            loops.append((f"radserve-device-{device}", partial(sched.next_dispatch, device)))
            loops.append(
                (f"radserve-feed-{device}", partial(sched.next_cpu_dispatch, feed_only=True))
            )
        loops += [(f"radserve-cpu-{i}", sched.next_cpu_dispatch) for i in range(self.cpu_workers)]
        if self.urgent_lane:
            loops.append(
                ("radserve-cpu-urgent", partial(sched.next_cpu_dispatch, urgent_only=True))
            )
        for name, fetch in loops:
            self._threads.append(
                threading.Thread(target=self._work, args=(fetch,), name=name, daemon=True)
            )
        self._threads.append(
            threading.Thread(target=self._watchdog, name="radserve-watchdog", daemon=True)
        )
        for thread in self._threads:
            thread.start()
        logger.info(
            "executor started: devices %s, %d CPU workers%s",
            ", ".join(self.devices),
            self.cpu_workers,
            " + URGENT lane" if self.urgent_lane else "",
        )

    def stop(self, *, wait: bool = True) -> None:
        self._stopping.set()
        self._wake()
        if wait:
            for thread in self._threads:
                thread.join()
        self.scheduler.remove_listener(self._wake)
        self._threads = []

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the scheduler has no unfinished job; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.scheduler.idle, timeout)

    def _wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def _work(self, fetch: Callable[[], Dispatch | None]) -> None:
        while not self._stopping.is_set():
            with self._cond:
                generation = self._generation
            try:
                dispatch = fetch()
                if dispatch is not None:
                    self.scheduler.complete(dispatch, execute(dispatch))
                    continue
            except Exception:  # a scheduler bug must not silently kill a worker
                logger.exception("worker %s failed", threading.current_thread().name)
            with self._cond:
                if self._generation == generation and not self._stopping.is_set():
                    held = self.scheduler.holding
                    self._cond.wait(self._hold_wait_s if held else self._idle_wait_s)

    def _watchdog(self) -> None:
        while not self._stopping.wait(self.watchdog_interval_s):
            try:
                self.scheduler.tick()
            except Exception:
                logger.exception("scheduler watchdog failed")


def run_serial(
    scheduler: Scheduler,
    *,
    devices: Sequence[str] = ("cpu",),
    on_dispatch: Callable[[Dispatch], None] | None = None,
    max_dispatches: int = 1_000_000,
) -> int:
    """Run dispatches one at a time on this thread until none is left; returns how many.

    Device batches are taken before CPU work. ``on_dispatch`` sees each unit before it
    runs (a test records the dispatch order there, or submits a job mid-way).
    """
    for count in range(max_dispatches):
        dispatch: Dispatch | None = None
        for device in devices:
            dispatch = scheduler.next_dispatch(device)
            if dispatch is not None:
                break
        if dispatch is None:
            dispatch = scheduler.next_cpu_dispatch()
        if dispatch is None:
            return count
        if on_dispatch is not None:
            on_dispatch(dispatch)
        scheduler.complete(dispatch, execute(dispatch))
    raise RuntimeError(f"run_serial: still busy after {max_dispatches} dispatches")


__all__ = ["Executor", "InProcessExecutor", "run_serial"]
