"""A :class:`~radserve.service.turnaround.Turnaround` on its own: a real SQLite store and
scheduler under a fake clock, every job an OUTPATIENT job whose study folder is missing
(its size is the model's typical one). The risk and alert tests drive it directly."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from radserve.config import SchedulerSettings, load_settings
from radserve.domain.priority import PriorityClass
from radserve.scheduling import Scheduler
from radserve.scheduling.clock import FakeClock
from radserve.service.metrics import Metrics
from radserve.service.turnaround import Turnaround
from radserve.store import JobRecord, init_store
from radserve.store import JobState as StoredState


def missing_study_lookup(tmp_path: Path) -> Callable[[str], JobRecord]:
    """Every job a queued OUTPATIENT job whose study folder is missing (the typical size),
    its deadline its arrival + the default OUTPATIENT TAT, as a job row's would be."""
    now = dt.datetime.now(dt.UTC)
    deadline = now + dt.timedelta(seconds=SchedulerSettings().tat(PriorityClass.OUTPATIENT))

    def lookup(job_id: str) -> JobRecord:
        return JobRecord(
            job_id, StoredState.QUEUED, PriorityClass.OUTPATIENT, now, deadline, "ct", "1",
            "fp32", "f", str(tmp_path / "no-such-study"),
        )  # fmt: skip

    return lookup


def standalone_turnaround(
    tmp_path: Path, clock: FakeClock, **settings: Any
) -> tuple[Turnaround, CollectorRegistry]:
    """The turnaround with ``settings`` (``turnaround__...`` keys), and its metrics."""
    loaded = load_settings(None, data_dir=tmp_path / "data", **settings)
    lookup = missing_study_lookup(tmp_path)
    scheduler = Scheduler(SchedulerSettings(max_running=1), clock=clock)
    metrics = Metrics(scheduler.snapshot)
    turnaround = Turnaround(
        loaded,
        store=init_store(f"sqlite:///{tmp_path / 'radserve.db'}"),
        scheduler=scheduler,
        metrics=metrics,
        lookup=lookup,
        device="cpu",
        cpu_workers=2,
    )
    return turnaround, metrics.registry
