"""Metrics, structured logs without patient data, and the audit chain, seen from a real
server processing real (tiny) studies."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import httpx
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.audit.digests import file_sha256
from radserve.service import Service
from radserve.service.logs import QUIET_LOGGERS, JsonFormatter, configure_logging
from radserve.store.audited import open_audited

PHI = {
    "PatientName": "Quixley^Marguerite^Anne",
    "PatientID": "MRN-88317702",
    "PatientBirthDate": "19390412",
    "OtherPatientIDs": "ALT-55190",
    "AccessionNumber": "ACC-99127",
}


def test_formatter_writes_one_json_object_with_the_job_id() -> None:
    record = logging.LogRecord(
        "radserve.x",
        logging.INFO,
        __file__,
        1,
        "job %s -> %s",
        ("0f6b2c1e-8f0a-4a4b-9c1d-2e3f4a5b6c7d", "running"),
        None,
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "job 0f6b2c1e-8f0a-4a4b-9c1d-2e3f4a5b6c7d -> running"
    assert line["job_id"] == "0f6b2c1e-8f0a-4a4b-9c1d-2e3f4a5b6c7d"
    assert (
        line["level"] == "info" and line["logger"] == "radserve.x" and line["ts"].endswith("+00:00")
    )


def test_logs_metrics_and_audit_of_real_jobs(tmp_path: Path) -> None:
    """Everything radserve logs while it takes, runs, fails and reports studies (DEBUG,
    JSON lines) carries no patient name, ID, birth date or accession number."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        service = Service(settings_for(tmp_path))
        key = create_key(service.store, "admin")
        with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
            good = make_study(tmp_path / "good", extra=PHI)
            bad = make_study(tmp_path / "bad", extra=PHI)
            truncated = [
                ("files", (p.name, p.read_bytes()[:900], "application/dicom")) for p in bad
            ]
            ids = [
                c.post("/v1/studies", files=files, headers=auth(key)).json()["id"]
                for files in (upload(good), truncated)
            ]
            jobs = [wait_job(c, job_id, key) for job_id in ids]
            assert [j["state"] for j in jobs] == ["succeeded", "failed"]
            assert c.get(f"/v1/jobs/{ids[0]}/fhir", headers=auth(key)).status_code == 200
            assert c.get(f"/v1/jobs/{ids[0]}/report", headers=auth(key)).status_code == 200
            assert c.get("/v1/jobs/nope", headers=auth(key)).status_code == 404
            metrics = c.get("/metrics").text
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    text = stream.getvalue()
    lines = [json.loads(line) for line in text.splitlines()]
    assert any(line.get("job_id") == ids[0] for line in lines)
    for value in PHI.values():
        for form in {value, value.replace("^", " "), value.split("^")[0]}:
            assert form not in text, f"{form!r} leaked into the logs"

    for family in (
        'radserve_queue_depth{cls="URGENT"}',
        'radserve_job_turnaround_seconds_bucket{cls="OUTPATIENT"',
        'radserve_stage_seconds_bucket{le="0.1",stage="ingest"}',
        "radserve_batch_size_bucket",
        "radserve_batch_seconds_bucket",
        'radserve_jobs_total{cls="OUTPATIENT",state="succeeded"}',
        "radserve_errors_total{code=",
        'radserve_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"}',
        'radserve_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="404"}',
        "radserve_http_request_seconds_bucket",
        'radserve_device_utilization_ratio{device="cpu"}',
        "radserve_deadline_misses",
    ):
        assert family in metrics, family

    # the service's store closed when the server stopped: open the database again
    store, _ = open_audited(service.settings)
    try:
        assert store.verify_audit().ok
        records = list(store.iter_audit())
        result_dir = Path(store.get_job(ids[0]).result_path or "")
    finally:
        store.close()
    actions = [r.action for r in records]
    assert {
        "config.loaded",
        "model.changed",
        "job.submitted",
        "job.succeeded",
        "job.failed",
    } <= set(actions)
    submitted = next(r for r in records if r.action == "job.submitted" and r.subject == ids[0])
    assert submitted.actor_key_id == key.split("_")[1]
    assert submitted.client_address == "127.0.0.1"
    assert len(submitted.payload["fingerprint"]) == 64
    audit_text = json.dumps([r.to_json() for r in records])
    for value in PHI.values():
        assert value not in audit_text
    succeeded = [r for r in records if r.action == "job.succeeded" and r.subject == ids[0]]
    assert len(succeeded) == 1
    outputs = succeeded[0].payload["outputs"]
    assert (outputs["findings"], outputs["organs"]) == (1, 1)
    assert outputs["sha256"]["report.json"] == file_sha256(result_dir / "report.json")
    assert outputs["model_sha256"] and all(len(h) == 64 for h in outputs["model_sha256"].values())


def test_libraries_that_log_datasets_are_held_at_warning() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(logging.DEBUG)
        assert all(logging.getLogger(n).level >= logging.WARNING for n in QUIET_LOGGERS)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
