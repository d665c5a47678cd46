"""Succeeded jobs written straight into a store, for commands that read the store's
history (``radserve plan``: its service times and its replay)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from radserve.domain.priority import PriorityClass
from radserve.store import CacheKey, Store

FIELDS = {
    "pipeline_name": "ct",
    "pipeline_version": "1.0",
    "model_versions": {"organs": "1.0"},
    "precision": "fp32",
}
# what each job measured: 4 s start to finish, 2 s of it on the device
TIMINGS = {"ingest": 1.0, "organs: infer": 2.0, "report": 1.0, "run": 4.0}


def finished_jobs(
    store: Store, results: Path, count: int, cls: PriorityClass, deadline_s: float
) -> list[str]:
    """``count`` jobs of the 40-slice test study, all started before any ends (they ran
    at the same time), then each recorded succeeded with :data:`TIMINGS`; their ids."""
    started = []
    for n in range(count):
        fp = f"{n}" * 64
        job = store.create_job(
            priority_class=cls,
            deadline=dt.timedelta(seconds=deadline_s),
            study_path=f"studies/{fp}",
            fingerprint=fp,
            **FIELDS,  # type: ignore[arg-type]
        )
        store.transition(job.id, "queued")
        store.transition(job.id, "running")
        started.append((job.id, fp))
    for job_id, fp in started:
        out = results / job_id
        out.mkdir(parents=True)
        (out / "report.json").write_text(json.dumps({"geometry": {"shape": [40, 8, 8]}}))
        key = CacheKey(fingerprint=fp, **FIELDS)  # type: ignore[arg-type]
        store.record_result(job_id, str(out), key, stage_timings=TIMINGS)
    return [job_id for job_id, _ in started]


def stored_burst(data: Path, count: int, gap_ms: int = 1) -> None:
    """A new data folder ``data`` whose SQLite store holds ``count`` OUTPATIENT jobs that
    arrived ``gap_ms`` apart (queued, never run): a burst for ``radserve plan --replay``."""
    from radserve.store import init_store

    data.mkdir()
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    start = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    try:
        for i in range(count):
            fp = f"{i:064d}"
            store.create_job(
                priority_class=PriorityClass.OUTPATIENT,
                deadline=dt.timedelta(hours=2),
                study_path=f"studies/{fp}",
                fingerprint=fp,
                pipeline_name="ct",
                pipeline_version="1",
                precision="fp32",
                arrival=start + dt.timedelta(milliseconds=i * gap_ms),
            )
    finally:
        store.close()
