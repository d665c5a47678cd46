"""``radserve bench --scenario scale``: one fixed queue of studies drained by 1 and 2 workers.

The same phantom studies (one URGENT, the rest OUTPATIENT, all submitted at once) go
through the scheduler three times, over warm sessions:

- ``inprocess``: the in-process executor, one device with all usable cores;
- ``ray-1``: the Ray executor, one CPU worker with all usable cores;
- ``ray-2``: the Ray executor, two CPU workers splitting the cores.

For each: drain time and studies/hour, the device busy fraction (batch seconds over
drain time x workers), turnaround per class, and the mean batch time; the Ray
executor's per-batch overhead is ``ray-1``'s mean batch time minus ``inprocess``'s
(same threads, same batches: the difference is ``ray.put``, the actor call and the
result's way back). Ray needs the ``ray`` extra; without it only ``inprocess`` runs.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radserve.bench import PIPELINE
from radserve.bench.errors import BenchError
from radserve.bench.priority import ensure_studies
from radserve.host import usable_cores
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, StudyRequest
from radserve.pipeline.spec import load_pipeline
from radserve.scheduling import (
    BatchEvent,
    DeadlineMiss,
    InProcessExecutor,
    JobEvent,
    JobState,
    PriorityClass,
    Scheduler,
)

logger = logging.getLogger(__name__)


class _Recorder:
    """Hooks: when each job ended and how, and every device batch."""

    def __init__(self) -> None:
        self.ended: dict[str, float] = {}
        self.failures: list[str] = []
        self.batches: list[BatchEvent] = []
        self._lock = threading.Lock()

    def on_state(self, event: JobEvent) -> None:
        if event.state.terminal:
            with self._lock:
                self.ended[event.job_id] = time.perf_counter()
                if event.state is not JobState.SUCCEEDED:
                    self.failures.append(f"{event.job_id}: {event.error_code}")

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        pass

    def on_batch(self, event: BatchEvent) -> None:
        with self._lock:
            self.batches.append(event)


def _drain(
    name: str,
    make_executor: Callable[[Scheduler], Any],
    studies: list[tuple[str, Path, PriorityClass]],
    *,
    pipeline: Any,
    registry: ModelRegistry,
    sessions: SessionPool,
    out: Path,
    n_workers: int,
    timeout_s: float,
) -> dict[str, Any]:
    recorder = _Recorder()
    scheduler = Scheduler(hooks=recorder)
    executor = make_executor(scheduler)
    executor.start()

    def submit(job_id: str, folder: Path, cls: PriorityClass) -> None:
        request = StudyRequest(
            job_id=job_id,
            source=folder,
            pipeline=pipeline,
            out_dir=out / name / job_id,
            rules=scheduler.rules,
            priority=cls,
            key_images=False,
        ).job(registry=registry, sessions=sessions)
        scheduler.submit(request)

    try:
        # one study first, untimed: every worker's sessions warm, the files in the cache
        _, folder, _ = studies[0]
        for w in range(n_workers):
            submit(f"warm-up-{w}", folder, PriorityClass.OUTPATIENT)
        if not executor.wait_idle(timeout_s):
            raise BenchError(f"{name}: the warm-up did not finish within {timeout_s:.0f} s")
        recorder.batches.clear()
        submitted: dict[str, float] = {}
        t0 = time.perf_counter()
        for job_id, folder, cls in studies:
            submitted[job_id] = time.perf_counter()
            submit(job_id, folder, cls)
        if not executor.wait_idle(timeout_s):
            raise BenchError(f"{name}: the queue did not drain within {timeout_s:.0f} s")
        drain = time.perf_counter() - t0
        worker_stats = executor.stats() if hasattr(executor, "stats") else None
    finally:
        executor.stop()
    if recorder.failures:
        raise BenchError(f"{name}: studies failed: {'; '.join(recorder.failures)}")
    tat: dict[str, dict[str, float]] = {}
    for cls in PriorityClass:
        values = [recorder.ended[j] - submitted[j] for j, _, c in studies if c is cls]
        if values:
            tat[cls.name] = {
                "median_s": round(statistics.median(values), 3),
                "max_s": round(max(values), 3),
            }
    batch_s = [b.seconds for b in recorder.batches]
    items = sum(b.items for b in recorder.batches)
    return {
        "executor": name,
        "workers": n_workers,
        "studies": len(studies),
        "drain_s": round(drain, 3),
        "studies_per_hour": round(len(studies) / drain * 3600, 1),
        "device_busy_fraction": round(sum(batch_s) / (drain * n_workers), 3),
        "batches": len(batch_s),
        "items": items,
        "mean_batch_s": round(statistics.fmean(batch_s), 5) if batch_s else None,
        "mean_item_s": round(sum(batch_s) / items, 5) if items else None,
        "tat_by_class": tat,
        "per_worker": worker_stats,
    }


def run_scale_bench(
    *,
    n_studies: int = 6,
    n_slices: int = 60,
    cache_dir: Path | None = None,
    pipeline: str | Path = PIPELINE,
    timeout_s: float = 3600.0,
    with_ray: bool | None = None,
    log: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """Drain the same queue with each executor; returns the JSON summary."""
    cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    cores = usable_cores()
    log(f"preparing {n_studies} phantom studies of {n_slices} slices")
    urgent, routine = ensure_studies(cache_dir, n_studies - 1, n_slices)
    studies = [("urgent", urgent, PriorityClass.URGENT)] + [
        (f"routine-{i}", s, PriorityClass.OUTPATIENT) for i, s in enumerate(routine)
    ]
    registry = ModelRegistry()
    spec = load_pipeline(pipeline)
    sessions = SessionPool()
    if with_ray is None:
        try:
            import ray  # noqa: F401

            with_ray = True
        except ImportError:
            with_ray = False
    runs: list[dict[str, Any]] = []
    common = {"pipeline": spec, "registry": registry, "sessions": sessions, "timeout_s": timeout_s}
    with tempfile.TemporaryDirectory(prefix="radserve-scale-") as tmp:
        out = Path(tmp)
        device = sessions.runtime.device
        log("inprocess: 1 device")
        runs.append(
            _drain(
                "inprocess",
                lambda s: InProcessExecutor(s, devices=(device,)),
                studies,
                out=out,
                n_workers=1,
                **common,
            )
        )
        if with_ray:
            runs += _ray_runs(studies, cores, out, common, log)
    inproc = runs[0]
    summary: dict[str, Any] = {"cores": cores, "n_slices": n_slices, "runs": runs}
    one = next((r for r in runs if r["executor"] == "ray-1"), None)
    if one is not None and one["mean_batch_s"] and inproc["mean_batch_s"]:
        summary["ray_overhead_per_batch_ms"] = round(
            (one["mean_batch_s"] - inproc["mean_batch_s"]) * 1000, 2
        )
    return summary


def _ray_runs(
    studies: list[tuple[str, Path, PriorityClass]],
    cores: int,
    out: Path,
    common: dict[str, Any],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    import ray

    from radserve.scheduling.ray_executor import RayExecutor

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    runs = []
    try:
        half = max(1, cores // 2)
        for name, devices in (("ray-1", [f"cpu:{cores}"]), ("ray-2", [f"cpu:{half}"] * 2)):
            log(f"{name}: {', '.join(devices)}")
            runs.append(
                _drain(
                    name,
                    lambda s, d=devices: RayExecutor(s, devices=d),  # type: ignore[misc]
                    studies,
                    out=out,
                    n_workers=len(devices),
                    **common,
                )
            )
    finally:
        if started:
            ray.shutdown()
    return runs


__all__ = ["run_scale_bench"]
