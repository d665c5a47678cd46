"""The service's life cycle: readiness only after warm-up, cancelling a running job at a
batch boundary, restart recovery's limits, and the settings -> scheduler mapping."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

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

from radserve.api import create_app
from radserve.scheduling import PriorityClass
from radserve.service import Service, scheduler_config
from radserve.store import JobState

SLOW_GRID = {
    "n_slices": 24,
    "rows": 128,
    "cols": 128,
    "spacing": (2.0, 1.5, 1.5),
    "background": -100.0,
}


def test_settings_map_onto_the_scheduler(tmp_path: Path) -> None:
    settings = settings_for(
        tmp_path,
        scheduler__tat_s__inpatient=120,
        scheduler__queue_limits__outpatient=7,
        scheduler__max_queue_delay_ms=20,
        jobs__max_retries=4,
        jobs__timeout_s=60,
        priority_rules=[
            {"attribute": "CurrentPatientLocation", "values": ["ER"], "class": "URGENT"}
        ],
    )
    config = scheduler_config(settings)
    assert config.tat(PriorityClass.INPATIENT) == 120
    assert config.tat(PriorityClass.URGENT) == 60  # settings' 0 = start at once; target kept
    assert config.queue_limit(PriorityClass.OUTPATIENT) == 7
    assert config.queue_limit(PriorityClass.URGENT) is None
    assert config.max_queue_delay_s == pytest.approx(0.02)
    assert (config.max_retries, config.job_timeout_s) == (4, 60)
    assert config.rules.classify({"CurrentPatientLocation": "er"}) is PriorityClass.URGENT
    assert config.rules.classify({"RequestedProcedurePriority": "STAT"}) is PriorityClass.OUTPATIENT
    urgent = scheduler_config(settings_for(tmp_path / "b", scheduler__tat_s__urgent=30))
    assert urgent.tat(PriorityClass.URGENT) == 30
    # Dynamic batching: the settings' limit, capped by what the device is worth sending.
    assert config.max_batch_size == 32
    assert scheduler_config(settings, device_max_batch=2).max_batch_size == 2
    assert scheduler_config(settings, device_max_batch=None).max_batch_size == 32


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
        deadline = time.monotonic() + 30
        while c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        cancel = c.delete(f"/v1/jobs/{job_id}", headers=auth(key))
        assert cancel.status_code == 202
        job = wait_job(c, job_id, key)
        assert job["state"] == "cancelled" and job["error"]["code"] == "job_cancelled"
        assert time.monotonic() - t0 < 5  # one batch, not the rest of the study
        assert service.store.get_job(job_id).result_path is None
        after = c.post("/v1/studies", files=upload(make_study(tmp_path / "b")), headers=auth(key))
        assert wait_job(c, after.json()["id"], key)["state"] == "succeeded"


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
