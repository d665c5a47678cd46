"""The service's life cycle: readiness only after warm-up, cancelling a running job at a
batch boundary, restart recovery's limits, and the settings the scheduler takes."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_models_slow,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import until

from radserve.api import create_app
from radserve.scheduling import PriorityClass
from radserve.service import Service
from radserve.store import JobState

SLOW_GRID = {
    "n_slices": 24,
    "rows": 128,
    "cols": 128,
    "spacing": (2.0, 1.5, 1.5),
    "background": -100.0,
}


def test_the_scheduler_takes_the_settings_sections(tmp_path: Path) -> None:
    """No mapping layer: the service's scheduler holds the settings' own scheduler, jobs
    and priority_rules objects (only the batch size is capped by the device)."""
    settings = settings_for(
        tmp_path,
        scheduler__tat_s__inpatient=120,
        scheduler__queue_limits__outpatient=7,
        scheduler__max_queue_delay_ms=20,
        scheduler__max_running=2,
        scheduler__urgent_exclusive=False,
        jobs__max_retries=4,
        jobs__timeout_s=60,
        jobs__retry_backoff_s=1.5,
        priority_rules=[
            {"attribute": "CurrentPatientLocation", "values": ["ER"], "class": "URGENT"}
        ],
    )
    config = settings.scheduler
    assert config.tat(PriorityClass.INPATIENT) == 120
    assert config.tat(PriorityClass.URGENT) == 60  # the completion target; starts at once
    assert config.queue_limit(PriorityClass.OUTPATIENT) == 7
    assert config.queue_limit(PriorityClass.URGENT) is None
    assert config.max_queue_delay_s == pytest.approx(0.02)
    rules = settings.priority_rules
    assert rules.classify({"CurrentPatientLocation": "er"}) is PriorityClass.URGENT
    assert rules.classify({"RequestedProcedurePriority": "STAT"}) is PriorityClass.OUTPATIENT
    urgent = settings_for(tmp_path / "b", scheduler__tat_s__urgent=30).scheduler
    assert urgent.tat(PriorityClass.URGENT) == 30
    legacy = settings_for(tmp_path / "c", scheduler__tat_s__urgent=0).scheduler
    assert legacy.tat(PriorityClass.URGENT) == 60  # the old "start at once" spelling
    # Dynamic batching: the settings' limit, capped by what the device is worth sending.
    assert config.max_batch_size == 32
    assert config.capped(2).max_batch_size == 2
    assert config.capped(None) is config and config.capped(64) is config
    service = Service(settings)
    scheduler = service.scheduler
    assert scheduler.jobs is settings.jobs and scheduler.rules is settings.priority_rules
    cap = service.catalog.sessions.runtime.max_batch_size
    assert scheduler.config == config.capped(cap)
    assert (scheduler.config.max_running, scheduler.config.urgent_exclusive) == (2, False)


def test_not_ready_until_warmed_up(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path))
    key = create_key(service.store, "read")
    service.start(warm_up=False)
    try:
        with ServerThread(create_app(service, manage_service=False)) as srv:
            ready = httpx.get(f"{srv.url}/readyz", headers=auth(key))
            assert ready.status_code == 503 and "models are warming up" in ready.json()["reasons"]
            assert httpx.get(f"{srv.url}/healthz").json()["model_versions"] == {}
            service.catalog.warm_up()
            assert httpx.get(f"{srv.url}/readyz", headers=auth(key)).status_code == 200
            health = httpx.get(f"{srv.url}/healthz").json()
            assert health["model_versions"] == {"organs-test": "1.0.0", "lesions-test": "1.0.0"}
    finally:
        service.stop()


def test_cancel_a_running_job_stops_it_at_a_batch_boundary(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, scheduler__max_batch_size=2)
    make_models_slow(tmp_path / "assets" / "models", layers=4, channels=32)
    service = Service(settings)
    key = create_key(service.store, "submit")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        first = c.post(
            "/v1/studies", files=upload(make_study(tmp_path / "a", **SLOW_GRID)), headers=auth(key)
        )
        job_id = first.json()["id"]
        until(
            lambda: c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()["state"] == "running",
            "the first job to run",
            30,
            step=0.01,
        )
        # count the device batches started once the cancel is acknowledged (not wall
        # time: on a loaded machine one batch takes seconds)
        acknowledged, after_cancel = threading.Event(), []
        for name in ("organs-test", "lesions-test"):
            session = service.catalog.sessions.get(service.catalog.registry.get(name), "fp32")

            def counted(batch: Any, run: Any = session.run) -> Any:
                if acknowledged.is_set():
                    after_cancel.append(len(batch))
                return run(batch)

            session.run = counted  # type: ignore[method-assign]
        cancel = c.delete(f"/v1/jobs/{job_id}", headers=auth(key))
        assert cancel.status_code == 202
        acknowledged.set()
        job = wait_job(c, job_id, key)
        assert job["state"] == "cancelled" and job["error"]["code"] == "job_cancelled"
        # a batch boundary: not the rest of the study (24 slices through two models in
        # batches of 2 are 24 batches)
        assert len(after_cancel) <= 1, after_cancel
        stopped = len(after_cancel)
        assert service.store.get_job(job_id).result_path is None
        after = c.post("/v1/studies", files=upload(make_study(tmp_path / "b")), headers=auth(key))
        assert wait_job(c, after.json()["id"], key)["state"] == "succeeded"
        assert len(after_cancel) > stopped  # the count does see the service's batches


def test_restart_recovery_limits(tmp_path: Path) -> None:
    """A job interrupted too often fails instead of crashing the server in a loop; a job
    whose models changed while the server was down is not run with other models."""
    settings = settings_for(tmp_path, jobs__max_retries=1)
    service = Service(settings)
    resolved = service.catalog.resolve(None)
    study = tmp_path / "data" / "studies"
    common = {
        "priority_class": "OUTPATIENT",
        "deadline": dt.timedelta(minutes=30),
        "pipeline_name": resolved.spec.name,
        "pipeline_version": resolved.spec.version,
        "precision": "fp32",
        "fingerprint": "f" * 64,
        "study_path": str(study),
    }
    crashing = service.store.create_job(**common, model_versions=resolved.model_versions)
    for _ in range(2):  # ran twice, interrupted twice
        service.store.transition(crashing.id, JobState.QUEUED)
        service.store.transition(crashing.id, JobState.RUNNING)
    changed = service.store.create_job(**common, model_versions={"organs-test": "0.9.0"})
    service.start(warm_up=False)
    try:
        failed = service.store.get_job(crashing.id)
        assert failed.state is JobState.FAILED and failed.error_code == "job_interrupted"
        stale = service.store.get_job(changed.id)
        assert stale.state is JobState.FAILED and stale.error_code == "pipeline_changed"
    finally:
        service.stop()
