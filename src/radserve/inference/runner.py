"""Drive one task through one session: a plain loop, or a three-stage overlapped one.

Cancellation is checked at every batch boundary; a cancelled run raises
:class:`~radserve.inference.tasks.InferenceCancelledError` (code
``inference_cancelled``, not retryable) and returns nothing partial. ``progress`` is
called with ``(batches_done, total_batches)`` after each merged batch.

Timings (seconds): ``prepare`` (task construction included) and ``merge`` (the final
map-back of a patch task included) are measured by the task, ``infer`` here, ``wall``
from the runner's start to the finished prediction (task construction excluded). In
the overlapped runner the stages run concurrently, so their sum exceeds ``wall``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from radserve.domain.prediction import Prediction
from radserve.inference.tasks import Batch, InferenceCancelledError, Task

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


class Runs(Protocol):
    """What a runner needs of a session (``ModelSession`` or a test double)."""

    precision: str

    def run(self, batch: np.ndarray) -> np.ndarray: ...


def _cancelled(task: Task, cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise InferenceCancelledError(f"inference of {task.spec.key} was cancelled")


def _infer(task: Task, session: Runs, batch: Batch) -> np.ndarray:
    t0 = time.perf_counter()
    out = session.run(batch.inputs)
    task.add_timing("infer", time.perf_counter() - t0)
    return out


def run_task(
    task: Task,
    session: Runs,
    *,
    cancel: threading.Event | None = None,
    progress: Progress | None = None,
) -> Prediction:
    """Prepare, infer and merge each batch in turn on the calling thread."""
    t0 = time.perf_counter()
    done = 0
    while True:
        _cancelled(task, cancel)
        batch = task.next_batch()
        if batch is None:
            break
        task.accept(batch, _infer(task, session, batch))
        done += 1
        if progress is not None:
            progress(done, task.total_batches)
    return _finish(task, session, t0)


def release_arena(session: Runs) -> None:
    """A task's batches are done: let the session's arena shrink (sessions without one,
    such as test doubles, are left alone)."""
    release = getattr(session, "release_memory", None)
    if release is not None:
        release()


def _finish(task: Task, session: Runs, t0: float) -> Prediction:
    release_arena(session)
    prediction = task.finish(precision=session.precision)
    prediction.timings["wall"] = time.perf_counter() - t0
    return prediction


_END = object()


class _Stage(threading.Thread):
    """A worker that stops everyone on failure and hands its exception to the caller."""

    def __init__(self, name: str, body: Callable[[], None], stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self._body, self._halt = body, stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._body()
        except BaseException as exc:  # re-raised on the caller's thread
            self.error = exc
            self._halt.set()


def _put(q: queue.Queue[Any], item: object, stop: threading.Event) -> bool:
    """Put unless the run is stopping; False when it is."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _get(q: queue.Queue[Any], stop: threading.Event) -> Any:
    while not stop.is_set():
        try:
            return q.get(timeout=0.05)
        except queue.Empty:
            continue
    return _END


def run_task_overlapped(
    task: Task,
    session: Runs,
    *,
    cancel: threading.Event | None = None,
    progress: Progress | None = None,
    queue_size: int = 2,
) -> Prediction:
    """Prepare batch i+1 and merge batch i-1 on worker threads while batch i runs.

    The session runs on the calling thread; bounded queues (``queue_size``) between
    the stages keep at most ``2 * queue_size + 3`` batches in memory. The output is
    identical to :func:`run_task`: each batch is merged exactly once, in order.
    """
    t0 = time.perf_counter()
    stop = threading.Event()
    ready: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
    ran: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
    merged = 0

    def cancelled() -> bool:
        if cancel is not None and cancel.is_set():
            stop.set()  # wakes every stage; the caller raises below
            return True
        return False

    def prepare() -> None:
        while not cancelled():
            batch = task.next_batch()
            if not _put(ready, _END if batch is None else batch, stop) or batch is None:
                return

    def merge() -> None:
        nonlocal merged
        while not cancelled():
            item = _get(ran, stop)
            if item is _END:
                return
            batch, output = item
            task.accept(batch, output)
            merged += 1
            if progress is not None:
                progress(merged, task.total_batches)

    workers = [_Stage("radserve-prepare", prepare, stop), _Stage("radserve-merge", merge, stop)]
    for w in workers:
        w.start()
    try:
        while not cancelled():
            batch = _get(ready, stop)
            if batch is _END:
                break
            output = _infer(task, session, batch)
            if not _put(ran, (batch, output), stop):
                break
        _put(ran, _END, stop)
        workers[1].join()
    finally:
        # Normal end: both workers are past their last item. Error or cancel: wake them.
        stop.set()
        for w in workers:
            w.join()
    for w in workers:
        if w.error is not None:
            raise w.error
    _cancelled(task, cancel)
    return _finish(task, session, t0)


__all__ = ["Progress", "Runs", "release_arena", "run_task", "run_task_overlapped"]
