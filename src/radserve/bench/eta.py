"""``radserve bench --scenario eta``: what one ETA recomputation costs with N unfinished
jobs (the scheduler's real queue order, the learned-model estimates, the walk), i.e.
the work :class:`radserve.service.turnaround.Turnaround` does on each scheduling event.

Jobs are submitted to a real :class:`~radserve.scheduling.Scheduler` with work that is
never run (no executor), so the queue holds exactly N jobs of mixed classes."""

from __future__ import annotations

import statistics
import time
from typing import Any

from radserve.config import QueueLimits, SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.scheduling import JobRequest, Scheduler
from radserve.turnaround.eta import Capacity, Entry, walk
from radserve.turnaround.service_time import ServiceTimeModel, StudySize

_CLASSES = (
    (PriorityClass.OUTPATIENT,) * 6 + (PriorityClass.INPATIENT,) * 3 + (PriorityClass.URGENT,)
)


class _IdleWork:
    """Work that is queued and never dispatched (no executor runs)."""

    models: tuple[str, ...] = ()

    def next_stage(self) -> None:
        return None

    def result(self) -> object:
        return None


def _model() -> ServiceTimeModel:
    model = ServiceTimeModel()
    for slices in (100, 200, 300, 400, 500) * 20:
        model.observe(
            pipeline="ct",
            device="cpu",
            precision="fp32",
            size=StudySize(slices),
            timings={
                "ingest": 0.003 * slices,
                "organs: infer": 0.006 * slices,
                "organs: postprocess": 0.5,
                "lesions: infer": 0.007 * slices,
                "report": 0.2,
                "run": 0.019 * slices + 0.7,
            },
            share_s=0.005 * slices + 0.2,  # the walk's throughput bound adds these up
        )
    return model


def eta_cost(jobs: int, repeats: int = 20) -> dict[str, Any]:
    """Median / max milliseconds of one recomputation over ``jobs`` queued jobs."""
    settings = SchedulerSettings(queue_limits=QueueLimits(inpatient=None, outpatient=None))
    scheduler = Scheduler(settings)
    for i in range(jobs):
        scheduler.submit(JobRequest(f"job-{i}", _IdleWork(), _CLASSES[i % len(_CLASSES)]))
    model = _model()
    sizes = {f"job-{i}": StudySize(100 + (i * 37) % 400) for i in range(jobs)}
    capacity = Capacity(2, 1, settings.max_running, settings.urgent_exclusive)
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        now, order = scheduler.queue_order()
        entries = [
            Entry(
                job.job_id,
                job.cls.rank,
                job.running,
                job.deadline,
                job.started,
                model.estimate(
                    pipeline="ct", device="cpu", precision="fp32", size=sizes[job.job_id]
                ),
            )
            for job in order
        ]
        etas = walk(entries, now, capacity)
        seconds.append(time.perf_counter() - began)
        assert len(etas) == jobs
    return {
        "jobs": jobs,
        "repeats": repeats,
        "median_ms": round(statistics.median(seconds) * 1000, 3),
        "max_ms": round(max(seconds) * 1000, 3),
    }


__all__ = ["eta_cost"]
