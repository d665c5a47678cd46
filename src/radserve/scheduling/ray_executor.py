"""The cluster executor: device batches run on Ray actors, one per device.

Same :class:`~radserve.scheduling.executor.Executor` protocol and the same
:class:`~radserve.scheduling.core.Scheduler` as :class:`InProcessExecutor`: each worker
(a :class:`~radserve.scheduling.ray_worker.DeviceWorker` actor) has a loop thread in
this process that asks the scheduler for *that worker's* next batch, so an URGENT study
overtakes routine work at the next batch boundary on every worker. The batch's inputs go
to the actor through Ray's object store (``ray.put`` of the numpy array; the actor reads
it zero-copy), its output comes back the same way.

Preparing and merging batches, ingest, post-processing and reports stay on CPU threads
of this process, as in the in-process executor.

Faults: a worker that dies mid-batch (its process killed, its node lost) or hangs past
``batch_timeout_s`` (then it is killed) loses only that batch: the batch goes to a
queue every worker loop drains before asking the scheduler, so another worker runs it;
the scheduler never sees the failure, so the job gets exactly one result and the
model's circuit breaker is not charged for a lost worker. Ray restarts the actor
(``max_restarts``); one whose restarts are spent is replaced by a new actor. While a
worker is lost, :meth:`RayExecutor.workers_down` names it (``/readyz`` and
``/metrics``: :mod:`radserve.service.executors`).

A batch lost :data:`MAX_BATCH_LOSSES` times is not run again: a study whose batch
kills every worker that runs it (out of memory, a crash in the runtime) used to go round
the workers for ever, each of them running it before any other work, so every study
behind it stalled and the job never ended (not even at its timeout: the batch was still
in flight). A lost batch of several studies is run again one study per batch, so only
the study that kills the workers fails: with :class:`BatchLostError`, reported to the
scheduler as the batch's failure.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from radserve.scheduling.core import Scheduler
from radserve.scheduling.dispatch import BatchDispatch, DispatchOutcome, run_batch
from radserve.scheduling.executor import WorkerThreads
from radserve.scheduling.ray_worker import DeviceSlot, RayExecutorError, actor_class

logger = logging.getLogger(__name__)

# a batch whose worker died (or hung) this many times is failed instead of run again
MAX_BATCH_LOSSES = 3


class WorkerLost(Exception):
    """The worker died or hung during a batch: run the batch elsewhere (internal)."""


class BatchLostError(RayExecutorError):
    """Every worker that ran this study's batch died or hung: the study itself is the
    likely cause (out of memory, a crash in the runtime), so it is not run again."""

    code = "batch_lost"
    retryable = False


@dataclass(frozen=True)
class _Orphan:
    """A batch whose worker was lost, waiting for another, and how often it was lost."""

    dispatch: BatchDispatch
    losses: int


@dataclass
class RayWorker:
    """One actor and what this process knows of it."""

    slot: DeviceSlot
    actor: Any
    pid: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    loaded: set[tuple[str, str]] = field(default_factory=set)
    batches: int = 0
    items: int = 0
    lost: int = 0
    busy_s: float = 0.0
    # the batch this worker runs now (None between batches): for stats and fault tests
    current: BatchDispatch | None = None
    # False from a loss until the worker answers again (restarted or replaced)
    up: bool = True
    # when it was last lost (time.monotonic), for how long it is down
    down_since: float | None = None


class _RemoteSession:
    """A :class:`~radserve.inference.runner.Runs` that runs on ``worker``'s actor."""

    def __init__(self, executor: RayExecutor, worker: RayWorker, local: Any) -> None:
        path = getattr(local, "path", None)
        if path is None or getattr(local, "spec", None) is None:
            raise RayExecutorError(
                "the Ray executor runs sessions loaded from ONNX files (ModelSession); "
                f"got {type(local).__name__}"
            )
        self._ex, self._w, self._local = executor, worker, local
        self.precision: str = local.precision
        self._key = (str(path), self.precision)

    def run(self, batch: np.ndarray) -> np.ndarray:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        w, timeout = self._w, self._ex.batch_timeout_s
        try:
            if self._key not in w.loaded:
                ray.get(w.actor.load.remote(*self._key, self._local.spec), timeout=timeout)
                w.loaded.add(self._key)
            ref = ray.put(np.ascontiguousarray(batch))
            out = ray.get(w.actor.run.remote(*self._key, ref), timeout=timeout)
        except GetTimeoutError as exc:
            logger.error("worker %s: batch past %.0f s, replacing it", w.slot.name, timeout)
            ray.kill(w.actor, no_restart=False)  # Ray restarts it (max_restarts)
            raise WorkerLost(f"{w.slot.name} hung") from exc
        except RayActorError as exc:
            raise WorkerLost(f"{w.slot.name} died") from exc
        except RayTaskError as exc:  # the model's own error, raised in the actor
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, Exception) else exc) from None
        return out


class RayExecutor(WorkerThreads):
    """Ray actors for the devices, threads of this process for the CPU work.

    ``address``: ``"local"`` starts a Ray instance owned by this process (stopped with
    it); anything else is passed to ``ray.init`` (``host:port`` of a running head, or
    ``auto``). A Ray already initialised in this process (tests) is used as it is.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        devices: Sequence[str] = ("cpu",),
        address: str = "local",
        providers: Sequence[str] = (),
        cpu_workers: int = 2,
        urgent_lane: bool = True,
        num_cpus: int | None = None,
        object_store_bytes: int | None = None,
        batch_timeout_s: float = 300.0,
        max_restarts: int = 3,
        startup_timeout_s: float = 120.0,
        watchdog_interval_s: float = 0.5,
        idle_wait_s: float = 1.0,
        max_batch_losses: int = MAX_BATCH_LOSSES,
    ) -> None:
        if not devices:
            raise ValueError("the Ray executor needs at least one device (ray.devices)")
        if cpu_workers < 1:
            raise ValueError(f"cpu_workers must be >= 1, got {cpu_workers}")
        super().__init__(
            scheduler, watchdog_interval_s=watchdog_interval_s, idle_wait_s=idle_wait_s
        )
        self.slots = tuple(DeviceSlot.parse(d, i) for i, d in enumerate(devices))
        self.address = address
        self.providers = tuple(providers)
        self.cpu_workers = cpu_workers
        self.urgent_lane = urgent_lane
        self.num_cpus = num_cpus
        self.object_store_bytes = object_store_bytes
        self.batch_timeout_s = batch_timeout_s
        self.max_restarts = max_restarts
        self.startup_timeout_s = startup_timeout_s
        self.max_batch_losses = max_batch_losses
        self._orphans: deque[_Orphan] = deque()
        self._owns_ray = False
        # the thread Ray's local processes belong to (see _init_on_owner_thread)
        self._release_owner = threading.Event()
        self.workers: list[RayWorker] = []
        self.requeued = 0  # batches re-run on another worker after a worker was lost
        self.replaced = 0  # actors re-created after their restarts were spent
        self.failed_batches = 0  # batches lost max_batch_losses times: failed, not re-run
        # model sessions warmed up on every worker: (file, precision) -> spec
        self.warmed: dict[tuple[str, str], Any] = {}

    # --- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            raise RuntimeError("executor already started")
        self._init_ray()
        self.workers = [RayWorker(slot, self._new_actor(slot)) for slot in self.slots]
        for worker in self.workers:
            self._identify(worker, self.startup_timeout_s)
        sched = self.scheduler
        loops: list[tuple[str, Callable[[], None]]] = []
        for worker in self.workers:
            loops.append((f"radserve-{worker.slot.name}", partial(self._device_loop, worker)))
            feed = partial(sched.next_cpu_dispatch, feed_only=True)
            loops.append((f"radserve-feed-{worker.slot.name}", partial(self._work, feed)))
        for i in range(self.cpu_workers):
            loops.append((f"radserve-cpu-{i}", partial(self._work, sched.next_cpu_dispatch)))
        if self.urgent_lane:
            urgent = partial(sched.next_cpu_dispatch, urgent_only=True)
            loops.append(("radserve-cpu-urgent", partial(self._work, urgent)))
        loops.append(("radserve-watchdog", self._watchdog))
        self._start_threads(loops)
        logger.info(
            "Ray executor started: %s; %d CPU workers%s",
            ", ".join(
                f"{w.slot.name} ({w.info.get('device')}, node {w.info.get('node_ip')}, pid {w.pid})"
                for w in self.workers
            ),
            self.cpu_workers,
            " + URGENT lane" if self.urgent_lane else "",
        )

    def stop(self, *, wait: bool = True) -> None:
        import ray

        self._stop_threads(wait=wait)
        if ray.is_initialized():
            for worker in self.workers:
                ray.kill(worker.actor, no_restart=True)
            if self._owns_ray:
                ray.shutdown()
                self._owns_ray = False
        self._release_owner.set()

    def warm_session(self, session: Any, batch: np.ndarray) -> list[np.ndarray]:
        """Load ``session``'s model on every worker now and run ``batch`` through it
        there (the server's warm-up; readiness waits for it): the first study does not
        pay for loading, and a model a worker cannot load fails before it serves. One
        output per worker."""
        import ray

        key = (str(session.path), session.precision)
        self.warmed[key] = session.spec  # a restarted worker loads it again at once
        loads = [(w, w.actor.load.remote(*key, session.spec)) for w in self.workers]
        for worker, call in loads:
            ray.get(call, timeout=self.startup_timeout_s)
            worker.loaded.add(key)
        ref = ray.put(np.ascontiguousarray(batch))
        runs = [w.actor.run.remote(*key, ref) for w in self.workers]
        return [ray.get(call, timeout=self.batch_timeout_s) for call in runs]

    def stats(self) -> list[dict[str, Any]]:
        """Per worker: slot, pid, batches and items run, batches lost, busy seconds."""
        return [
            {
                "worker": w.slot.name,
                "pid": w.pid,
                "device": w.info.get("device"),
                "threads": w.info.get("threads"),
                "batches": w.batches,
                "items": w.items,
                "lost": w.lost,
                "busy_s": round(w.busy_s, 4),
                "up": w.up,
            }
            for w in self.workers
        ]

    def workers_down(self) -> dict[str, float]:
        """The workers lost and not back yet: name -> seconds since the loss."""
        now = time.monotonic()
        return {
            w.slot.name: now - (w.down_since or now)
            for w in self.workers
            if not w.up and w.down_since is not None
        }

    # --- Ray plumbing -----------------------------------------------------------------
    def _init_ray(self) -> None:
        # Ray's C crash handler would also catch SIGTERM in this process and abort it
        # (read when ray is first imported)
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        try:
            import ray
        except ImportError as exc:
            raise RayExecutorError(
                "executor: ray needs the Ray package: pip install 'radserve[ray]'"
            ) from exc
        if ray.is_initialized():
            return
        options: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "namespace": "radserve",
        }
        if self.address == "local":
            # said to Ray: left out, ray.init joins the cluster RAY_ADDRESS or the host's
            # last `ray start --head` names (someone else's), and then refuses num_cpus
            options["address"] = "local"
            if self.num_cpus is not None:
                options["num_cpus"] = self.num_cpus
            if self.object_store_bytes is not None:
                options["object_store_memory"] = self.object_store_bytes
        else:
            options["address"] = self.address
        self._init_on_owner_thread(ray, options)
        self._owns_ray = True

    def _init_on_owner_thread(self, ray: Any, options: dict[str, Any]) -> None:
        """``ray.init`` on a thread that lives until :meth:`stop`. A local Ray's processes
        (raylet, GCS) are started with Linux's parent-death signal, which fires when the
        *thread* that started them ends: started from the thread that happened to call
        :meth:`start` (a short-lived starter thread, or the API's thread pool, whose idle
        threads exit after 10 s), the raylet was killed seconds later and the server with
        it."""
        started = threading.Event()
        failed: list[BaseException] = []

        def own() -> None:
            try:
                # ray.init replaces SIGTERM/SIGINT handling where it can (main thread only)
                with keep_signal_handlers():
                    ray.init(**options)
            except BaseException as exc:  # re-raised on the calling thread
                failed.append(exc)
                started.set()
                return
            started.set()
            self._release_owner.wait()

        self._release_owner.clear()
        threading.Thread(target=own, name="radserve-ray-owner", daemon=True).start()
        # ray.init retries a head that does not answer for ever (logging Ray's own
        # warnings every 30 s): the server neither started nor stopped on SIGTERM
        if not started.wait(self.startup_timeout_s):
            raise RayExecutorError(
                f"the Ray cluster at {self.address} did not answer within "
                f"{self.startup_timeout_s:.0f} s (ray.startup_timeout_s): start its head "
                "(`ray start --head`) or correct ray.address"
            )
        if failed:
            raise failed[0]

    def _new_actor(self, slot: DeviceSlot) -> Any:
        cls = actor_class().options(**slot.actor_options(self.max_restarts))
        return cls.remote(slot, self.providers)

    def _identify(self, worker: RayWorker, timeout: float) -> None:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            worker.info = ray.get(worker.actor.ping.remote(), timeout=timeout)
        except GetTimeoutError as exc:
            raise RayExecutorError(
                f"worker {worker.slot.name} did not start within {timeout:.0f} s: the Ray "
                f"cluster may lack the resources it asks for "
                f"({worker.slot.actor_options(self.max_restarts)})"
            ) from exc
        worker.loaded.clear()  # a new process: nothing loaded (cleared before the pid shows it)
        worker.pid = int(worker.info["pid"])

    def _recover(self, worker: RayWorker) -> None:
        """After a loss: wait for Ray's restart of the actor, or replace it."""
        from ray.exceptions import GetTimeoutError, RayActorError

        while not self._stopping.is_set():
            try:
                self._identify(worker, self.startup_timeout_s)
                logger.warning("worker %s is back (pid %d)", worker.slot.name, worker.pid)
                self._rewarm(worker)
                worker.up, worker.down_since = True, None
                return
            except (RayActorError, RayExecutorError, GetTimeoutError) as exc:
                logger.error("worker %s cannot restart (%s): replacing it", worker.slot.name, exc)
                worker.actor = self._new_actor(worker.slot)
                self.replaced += 1

    def _rewarm(self, worker: RayWorker) -> None:
        """Load the warmed-up models on a restarted worker before it takes a batch; one
        that fails to load is loaded at its first batch instead (and fails there)."""
        import ray

        for key, spec in list(self.warmed.items()):
            try:
                ray.get(worker.actor.load.remote(*key, spec), timeout=self.startup_timeout_s)
            except Exception as exc:  # the batch path loads it again and reports why
                logger.error("worker %s: reloading a model failed (%s)", worker.slot.name, exc)
            else:
                worker.loaded.add(key)

    # --- loops ------------------------------------------------------------------------
    def _next_batch(self, worker: RayWorker) -> tuple[BatchDispatch, int] | None:
        """A lost batch first (with how often it was lost), else the scheduler's next."""
        with self._cond:
            if self._orphans:
                orphan = self._orphans.popleft()
                return orphan.dispatch, orphan.losses
        dispatch = self.scheduler.next_dispatch(worker.slot.name)
        return None if dispatch is None else (dispatch, 0)

    def _device_loop(self, worker: RayWorker) -> None:
        while not self._stopping.is_set():
            with self._cond:
                generation = self._generation
            try:
                nxt = self._next_batch(worker)
                if nxt is not None:
                    self._run_on(worker, *nxt)
                    continue
            except Exception:  # a scheduler bug must not silently kill a worker loop
                logger.exception("worker loop %s failed", worker.slot.name)
            self._sleep(generation)

    def _run_on(self, worker: RayWorker, dispatch: BatchDispatch, losses: int = 0) -> None:
        remote = _RemoteSession(self, worker, dispatch.session)
        t0 = time.perf_counter()
        worker.current = dispatch
        try:
            outcome = DispatchOutcome(value=run_batch(replace(dispatch, session=remote)))
        except WorkerLost as exc:
            worker.current = None
            worker.lost += 1
            worker.up, worker.down_since = False, time.monotonic()
            self._lost(worker, dispatch, losses + 1, exc)
            self._recover(worker)
            return
        except Exception as exc:  # the model's error: the scheduler retries or fails
            outcome = DispatchOutcome(error=exc)
        worker.current = None
        worker.busy_s += time.perf_counter() - t0
        worker.batches += 1
        worker.items += dispatch.items
        self.scheduler.complete(replace(dispatch, device=worker.slot.name), outcome)

    def _lost(
        self, worker: RayWorker, dispatch: BatchDispatch, losses: int, exc: WorkerLost
    ) -> None:
        """``dispatch`` was lost on ``worker`` for the ``losses``-th time: run it again on
        the next free worker, one study per batch, or fail it once it was lost too often."""
        if losses >= self.max_batch_losses:
            self.failed_batches += 1
            error = BatchLostError(
                f"a batch of model {dispatch.model.name} was lost {losses} times: the "
                f"worker running it died or hung each time (last: {exc}); the study is "
                "not run again (out of memory, or a crash in the runtime, on this input?)"
            )
            logger.error(
                "worker %s lost a batch of %d item(s) (%s), lost %d times now: it is failed",
                worker.slot.name,
                dispatch.items,
                exc,
                losses,
            )
            self.scheduler.complete(
                replace(dispatch, device=worker.slot.name), DispatchOutcome(error=error)
            )
            return
        self.requeued += 1
        logger.error(
            "worker %s lost a batch of %d item(s) (%s); it runs on another worker",
            worker.slot.name,
            dispatch.items,
            exc,
        )
        # one study per batch from now on: if a study kills its workers, only it fails
        parts = [replace(dispatch, parts=(part,)) for part in dispatch.parts]
        with self._cond:
            self._orphans.extend(_Orphan(part, losses) for part in parts)
            self._generation += 1
            self._cond.notify_all()


@contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Put back this process's SIGTERM/SIGINT handlers after the block (main thread only:
    elsewhere Python cannot set them). ``ray.init`` installs its own (a ``sys.exit`` and
    a C crash handler that aborts the process), which would turn the server's clean stop
    on SIGTERM into an abort."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)  # sigaction again: replaces the C handler too


__all__ = [
    "MAX_BATCH_LOSSES",
    "BatchLostError",
    "RayExecutor",
    "RayWorker",
    "WorkerLost",
    "keep_signal_handlers",
]
