"""A replica's status reads for a job it no longer runs come from the store.

In a database outage a replica's lease on a running job can run out; another replica
then takes the job over and finishes it. The first replica's memory still holds the job
as ``running`` (its last own write); before, ``GET /v1/jobs/{id}`` on that replica kept
answering ``running`` for good (seen in tests/e2e/test_postgres_restart.py under load).
Now a remembered unfinished record counts only while this server's scheduler runs the
job; otherwise the store answers. Real service and HTTP API, SQLite store; the other
replica's writes are made on the same store.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tests.factories.service import auth, live_server, settings_for

from radserve.store import JobState


def test_a_job_finished_elsewhere_is_read_from_the_store(tmp_path: Path) -> None:
    with live_server(settings_for(tmp_path)) as server:
        service, client, key = server["service"], server["client"], server["read"]
        store = service.store
        job = store.create_job(
            priority_class="OUTPATIENT",
            deadline=dt.timedelta(minutes=30),
            pipeline_name="test-pipeline",
            pipeline_version="0.0.1",
            precision="fp32",
            fingerprint="a" * 64,
            study_path=str(tmp_path / "nowhere"),
        )
        store.transition(job.id, JobState.QUEUED)
        running = store.transition(job.id, JobState.RUNNING)
        service.cache.put(running)  # this replica's last own write of the job
        assert not service.scheduler.runs(job.id)

        # the other replica, having taken it over, finishes it (here: fails it)
        store.transition(
            job.id, JobState.FAILED, error_code="study_invalid", error_message="elsewhere"
        )
        answer = client.get(f"/v1/jobs/{job.id}", headers=auth(key))
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "failed"
        assert service.jobs.get(job.id).state is JobState.FAILED

        # a finished record in memory is served from memory (it never changes)
        assert service.jobs.cached(job.id) is not None
