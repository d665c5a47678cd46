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

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from radserve.checkpoints import PauseLog, yielding_to
from radserve.scheduling.core import Scheduler
from radserve.scheduling.dispatch import Dispatch, execute

logger = logging.getLogger(__name__)

# A stopping executor still starts the tail stages of jobs whose device work is done
# (Scheduler.next_tail_dispatch: post-processing, report, lineage, DICOM results,
# publishing) for this long after the stop, so their results are recorded before the
# process exits; what runs then finishes, as every running unit does.
DRAIN_S = 20.0


class Executor(Protocol):
    """Pulls work from a scheduler and runs it until stopped."""

    def start(self) -> None: ...

    def stop(self, *, wait: bool = True) -> None: ...


class WorkerThreads:
    """What both executors share: threads of this process that pull dispatches from one
    :class:`Scheduler`, sleep until it changes (or a held batch's delay passes), and a
    watchdog that ticks it; ``stop`` ends them at a unit boundary, after the tail
    stages of the jobs whose device work is done (:data:`DRAIN_S`). A routine job's CPU
    unit runs with a waiter installed (:mod:`radserve.checkpoints`), so it pauses at its
    next checkpoint while URGENT work can run (where an URGENT lane runs that
    job's CPU work meanwhile). Subclasses build the loops in
    ``start`` and hand them to :meth:`_start_threads`."""

    def __init__(
        self, scheduler: Scheduler, *, watchdog_interval_s: float, idle_wait_s: float
    ) -> None:
        self.scheduler = scheduler
        self.watchdog_interval_s = watchdog_interval_s
        # Workers are woken by every scheduler change; the timeout is only a safety net,
        # except while a batch is held for dynamic batching.
        self._idle_wait_s = idle_wait_s
        self._hold_wait_s = scheduler.config.max_queue_delay_s or idle_wait_s
        self._cond = threading.Condition()
        self._generation = 0
        self._stopping = threading.Event()
        self.drain_s = DRAIN_S
        self._drain_until = 0.0  # monotonic; set by a waiting stop
        self._threads: list[threading.Thread] = []
        # A thread that takes URGENT work only: set by subclasses that start one. Routine
        # units pause at their checkpoints only beside it: a paused worker runs URGENT
        # work only while it is itself at the checkpoint, not while it waits for its own
        # decoding threads (paused there), so without the lane every CPU thread could be
        # stuck and the URGENT job they wait for would never get one.
        self.urgent_lane = False

    def _start_threads(self, loops: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Listen to the scheduler and start one daemon thread per (name, loop)."""
        self._stopping.clear()
        self.scheduler.add_listener(self._wake)
        self._threads = [threading.Thread(target=f, name=n, daemon=True) for n, f in loops]
        for thread in self._threads:
            thread.start()

    def _stop_threads(self, *, wait: bool) -> None:
        # a stop that waits lets the jobs whose device work is done finish first
        self._drain_until = time.monotonic() + (self.drain_s if wait else 0.0)
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

    def _sleep(self, generation: int) -> None:
        """Wait for a scheduler change after ``generation`` (none missed in between)."""
        with self._cond:
            if self._generation == generation and not self._stopping.is_set():
                held = self.scheduler.holding
                self._cond.wait(self._hold_wait_s if held else self._idle_wait_s)

    def _work(self, fetch: Callable[[], Dispatch | None]) -> None:
        """Run what ``fetch`` hands out on this thread until stopped."""
        while not self._stopping.is_set():
            with self._cond:
                generation = self._generation
            try:
                dispatch = fetch()
                if dispatch is not None:
                    pause = self.urgent_lane and self.scheduler.yields(dispatch)
                    waiter = partial(self._yield, threading.current_thread()) if pause else None
                    pauses = PauseLog() if pause else None
                    with yielding_to(waiter, pauses):
                        outcome = execute(dispatch)
                    if pauses is not None:
                        outcome = dataclasses.replace(outcome, paused_s=pauses.within())
                    self.scheduler.complete(dispatch, outcome)
                    continue
            except Exception:  # a scheduler bug must not silently kill a worker
                logger.exception("worker %s failed", threading.current_thread().name)
            self._sleep(generation)
        self._drain()

    def _drain(self) -> None:
        """Stopping: run the tail stages of jobs whose device work is done
        (:meth:`Scheduler.next_tail_dispatch`) until none is left and no unit that
        could lead to one is in flight, or :data:`DRAIN_S` has passed since the stop.
        Before, a job whose report was written during the stop never ran its last
        short stages: it stayed ``running`` and ran again, whole, after the restart."""
        while time.monotonic() < self._drain_until:
            with self._cond:
                generation = self._generation
            try:
                dispatch = self.scheduler.next_tail_dispatch()
                if dispatch is not None:
                    with yielding_to(None):
                        outcome = execute(dispatch)
                    self.scheduler.complete(dispatch, outcome)
                    continue
                if not self.scheduler.in_flight:
                    return
            except Exception:
                logger.exception("worker %s failed", threading.current_thread().name)
                return
            with self._cond:  # woken when a unit in flight completes
                if self._generation == generation:
                    self._cond.wait(min(0.25, max(0.0, self._drain_until - time.monotonic())))

    def _yield(self, owner: threading.Thread) -> None:
        """A routine unit's checkpoint: wait while URGENT work can run (a stopping
        executor lets it run on to its end, the unit boundary ``stop`` waits for).

        On the worker thread that runs the unit (``owner``), the wait lends the thread to
        URGENT CPU work meanwhile: the paused stage holds no lock at a checkpoint, and
        URGENT units never pause, so they run to their end on top of it. Threads the
        stage started (decoding pools) only wait.
        """
        lend = threading.current_thread() is owner
        while not self._stopping.is_set():
            with self._cond:
                generation = self._generation
            if self.scheduler.wait_routine(0.0 if lend else 0.25):
                return
            if not lend:
                continue
            dispatch = self.scheduler.next_cpu_dispatch(urgent_only=True)
            if dispatch is None:
                self._sleep(generation)  # woken by any change, the gate opening included
                continue
            with yielding_to(None):
                outcome = execute(dispatch)
            self.scheduler.complete(dispatch, outcome)

    def _watchdog(self) -> None:
        while not self._stopping.wait(self.watchdog_interval_s):
            try:
                self.scheduler.tick()
            except Exception:
                logger.exception("scheduler watchdog failed")


class InProcessExecutor(WorkerThreads):
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
        super().__init__(
            scheduler, watchdog_interval_s=watchdog_interval_s, idle_wait_s=idle_wait_s
        )
        self.devices = tuple(devices)
        self.cpu_workers = cpu_workers
        self.urgent_lane = urgent_lane

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("executor already started")
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
        self._start_threads(
            [(name, partial(self._work, fetch)) for name, fetch in loops]
            + [("radserve-watchdog", self._watchdog)]
        )
        logger.info(
            "executor started: devices %s, %d CPU workers%s",
            ", ".join(self.devices),
            self.cpu_workers,
            " + URGENT lane" if self.urgent_lane else "",
        )

    def stop(self, *, wait: bool = True) -> None:
        self._stop_threads(wait=wait)


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


__all__ = ["Executor", "InProcessExecutor", "WorkerThreads", "run_serial"]
