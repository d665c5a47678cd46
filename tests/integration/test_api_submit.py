"""Submitting studies over HTTP and reading their results: single and batch uploads,
DICOM and NIfTI, the result cache, listing with filters and pages, cancellation."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nibabel as nib
import numpy as np
import pytest
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    live_server,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.ingest import discover_series, load_series, save_nifti
from radserve.report.fhir import check_bundle
from radserve.service import Service


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("api-submit")
    with live_server(settings_for(root)) as live:
        yield {**live, "root": root}


def test_submit_poll_and_fetch_every_result(server: dict[str, Any], tmp_path: Path) -> None:
    c, key = server["client"], server["submit"]
    files = make_study(tmp_path / "study", extra={"PatientID": "PID-4711"})
    r = c.post("/v1/studies", files=upload(files), headers=auth(key))
    assert r.status_code == 202, r.text
    submitted = r.json()
    assert r.headers["location"] == f"/v1/jobs/{submitted['id']}"
    assert submitted["state"] in ("queued", "running", "succeeded")
    assert submitted["priority_class"] == "OUTPATIENT"
    assert submitted["model_versions"] == {"organs-test": "1.0.0", "lesions-test": "1.0.0"}

    job = wait_job(c, submitted["id"], key)
    assert job["state"] == "succeeded", job
    assert job["error"] is None and job["cached"] is False and job["attempts"] == 1
    assert {"queue", "ingest", "report", "total"} <= set(job["stage_timings"])

    reader = auth(server["read"])
    report = c.get(f"/v1/jobs/{job['id']}/report", headers=reader).json()
    assert report["job_id"] == job["id"] and len(report["findings"]) == 1
    labels = c.get(f"/v1/jobs/{job['id']}/labels", headers=reader, params={"kind": "findings"})
    assert labels.status_code == 200 and labels.content[:2] == b"\x1f\x8b"  # gzip NIfTI
    image = c.get(f"/v1/jobs/{job['id']}/images/1", headers=reader)
    assert image.status_code == 200 and image.content[:8] == b"\x89PNG\r\n\x1a\n"
    missing = c.get(f"/v1/jobs/{job['id']}/images/99", headers=reader)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "output_not_found"
    fhir = c.get(f"/v1/jobs/{job['id']}/fhir", headers=reader)
    assert fhir.headers["content-type"].startswith("application/fhir+json")
    bundle = fhir.json()
    assert bundle["resourceType"] == "Bundle" and check_bundle(bundle) == []
    patient = next(
        e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient"
    )
    assert patient["identifier"][0]["value"] == "PID-4711"


def test_same_study_again_is_answered_from_the_cache(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    files = make_study(tmp_path / "study")
    first = wait_job(
        c, c.post("/v1/studies", files=upload(files), headers=auth(key)).json()["id"], key
    )
    assert first["state"] == "succeeded"
    again = c.post("/v1/studies", files=upload(files[::-1]), headers=auth(key))  # any order
    assert again.status_code == 200
    job = again.json()
    assert job["cached"] is True and job["cached_from"] == first["id"]
    assert job["state"] == "succeeded" and job["id"] != first["id"]
    same = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key)).json()
    assert same["job_id"] == first["id"]  # the one result, not a second run


def test_the_same_study_zipped_is_answered_from_the_cache(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """A study sent as files and then zipped, or zipped twice by different tools, is the
    one study: before session 43 each zip's bytes were a new input, and the study ran
    again."""
    c, key = server["client"], server["submit"]
    files = make_study(tmp_path / "study")
    first = wait_job(
        c, c.post("/v1/studies", files=upload(files), headers=auth(key)).json()["id"], key
    )
    assert first["state"] == "succeeded"
    for year, method in ((2020, zipfile.ZIP_DEFLATED), (2026, zipfile.ZIP_STORED)):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=method) as archive:
            for path in files:
                info = zipfile.ZipInfo(f"{year}/{path.name}", date_time=(year, 1, 1, 0, 0, 0))
                archive.writestr(info, path.read_bytes())
        zipped = [("files", ("study.zip", buffer.getvalue(), "application/zip"))]
        again = c.post("/v1/studies", files=zipped, headers=auth(key))
        assert again.status_code == 200, again.text
        assert again.json()["cached"] is True and again.json()["cached_from"] == first["id"]


def test_a_cached_answer_keeps_a_stated_urgent_priority(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """``PriorityClass.URGENT == 0``: a truthiness test once replaced it by the cached
    job's class (issue 12, item 10). Every stated class must survive a cache hit."""
    c, key = server["client"], server["submit"]
    files = make_study(tmp_path / "study")
    first = wait_job(
        c, c.post("/v1/studies", files=upload(files), headers=auth(key)).json()["id"], key
    )
    assert first["state"] == "succeeded" and first["priority_class"] == "OUTPATIENT"
    for stated, expected in (("urgent", "URGENT"), ("inpatient", "INPATIENT")):
        again = c.post(
            "/v1/studies", params={"priority": stated}, files=upload(files), headers=auth(key)
        )
        assert again.status_code == 200, again.text
        job = again.json()
        assert job["cached"] is True and job["priority_class"] == expected, job
    unstated = c.post("/v1/studies", files=upload(files), headers=auth(key)).json()
    assert unstated["cached"] is True and unstated["priority_class"] == "OUTPATIENT"


def test_zip_upload_and_priority_from_dicom_rules(server: dict[str, Any], tmp_path: Path) -> None:
    c, key = server["client"], server["submit"]
    files = make_study(tmp_path / "study", extra={"RequestedProcedurePriority": "STAT"})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in files:
            archive.write(path, f"series/{path.name}")
    r = c.post(
        "/v1/studies",
        files=[("files", ("study.zip", buffer.getvalue(), "application/zip"))],
        headers=auth(key),
    )
    assert r.status_code == 202, r.text
    assert r.json()["priority_class"] == "URGENT"  # RequestedProcedurePriority STAT
    high_files = make_study(tmp_path / "high", extra={"RequestedProcedurePriority": "HIGH"})
    high = c.post("/v1/studies", files=upload(high_files), headers=auth(key)).json()
    assert high["priority_class"] == "INPATIENT"
    stated = c.post(
        "/v1/studies",
        params={"priority": "inpatient"},
        files=upload(make_study(tmp_path / "ip")),
        headers=auth(key),
    ).json()
    assert stated["priority_class"] == "INPATIENT"
    for job_id in (r.json()["id"], high["id"], stated["id"]):
        assert wait_job(c, job_id, key)["state"] == "succeeded"


def test_nifti_volume(server: dict[str, Any], tmp_path: Path) -> None:
    c, key = server["client"], server["submit"]
    make_study(tmp_path / "study")
    volume = load_series(discover_series(tmp_path / "study")[0]).volume
    save_nifti(volume, tmp_path / "ct.nii.gz")
    data = (tmp_path / "ct.nii.gz").read_bytes()
    r = c.post(
        "/v1/studies",
        files=[("files", ("whatever-name", data, "application/octet-stream"))],
        headers=auth(key),
    )
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"], key)
    assert job["state"] == "succeeded", job
    report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key)).json()
    assert len(report["findings"]) == 1


def test_a_nifti_outside_the_ingest_bounds_fails_its_job_and_nothing_else(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """A 3 KB .nii.gz of 64 x 64 x 24 voxels of 1 m: before, the model's resampling asked
    for a grid no memory holds and the OOM killer stopped the server (and, resumed on
    restart, stopped it again). Now the job fails on the header, naming the bound."""
    c, key = server["client"], server["submit"]
    metre = nib.Nifti1Image(np.full((64, 64, 24), -1000, np.int16), np.diag([1e3, 1e3, 1e3, 1]))
    nib.save(metre, tmp_path / "metre.nii.gz")
    assert (tmp_path / "metre.nii.gz").stat().st_size < 8192
    body = [
        ("files", ("metre.nii.gz", (tmp_path / "metre.nii.gz").read_bytes(), "application/gzip"))
    ]
    r = c.post("/v1/studies", files=body, headers=auth(key))
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"], key)
    assert job["state"] == "failed" and job["error"]["code"] == "geometry_invalid", job
    assert "1000\\1000 mm" in job["error"]["message"] and job["attempts"] == 1
    make_study(tmp_path / "study")
    volume = load_series(discover_series(tmp_path / "study")[0]).volume
    save_nifti(volume, tmp_path / "ct.nii.gz")
    good = [("files", ("ct.nii.gz", (tmp_path / "ct.nii.gz").read_bytes(), "application/gzip"))]
    after = c.post("/v1/studies", files=good, headers=auth(key))
    assert wait_job(c, after.json()["id"], key)["state"] == "succeeded"


def test_batch_of_studies(server: dict[str, Any], tmp_path: Path) -> None:
    c, key = server["client"], server["submit"]
    parts = []
    for name in ("a", "b", "c"):
        parts += upload(make_study(tmp_path / name), field=f"study-{name}")
    parts += [("study-bad", ("x.txt", b"not an image at all", "text/plain"))]
    r = c.post("/v1/studies/batch", files=parts, headers=auth(key))
    assert r.status_code == 207, r.text
    body = r.json()
    assert (body["accepted"], body["refused"]) == (3, 1)
    by_name = {item["study"]: item for item in body["items"]}
    assert by_name["study-bad"]["status"] == 415
    assert by_name["study-bad"]["error"]["code"] == "unsupported_media_type"
    for name in ("a", "b", "c"):
        item = by_name[f"study-{name}"]
        assert item["status"] == 202
        assert wait_job(c, item["job"]["id"], key)["state"] == "succeeded"


def test_list_filters_and_pages(server: dict[str, Any], tmp_path: Path) -> None:
    c, key = server["client"], server["read"]
    submit = auth(server["submit"])
    for name, priority in (("r1", None), ("r2", None), ("r3", None), ("u", "urgent")):
        params = {"priority": priority} if priority else {}
        files = upload(make_study(tmp_path / name))
        assert c.post("/v1/studies", params=params, files=files, headers=submit).is_success
    page = c.get("/v1/jobs", params={"limit": 2}, headers=auth(key)).json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    seen = [j["id"] for j in page["items"]]
    while page["next_cursor"]:
        page = c.get(
            "/v1/jobs", params={"limit": 2, "cursor": page["next_cursor"]}, headers=auth(key)
        ).json()
        seen += [j["id"] for j in page["items"]]
    assert len(seen) == len(set(seen)) >= 4
    urgent = c.get("/v1/jobs", params={"priority_class": "URGENT"}, headers=auth(key)).json()
    assert urgent["items"] and all(j["priority_class"] == "URGENT" for j in urgent["items"])
    done = c.get(
        "/v1/jobs", params=[("state", "succeeded"), ("state", "failed")], headers=auth(key)
    ).json()
    assert all(j["state"] in ("succeeded", "failed") for j in done["items"])
    bad = c.get("/v1/jobs", params={"cursor": "nonsense"}, headers=auth(key))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"
    assert c.get("/v1/jobs/no-such-job", headers=auth(key)).status_code == 404


def test_cancel_waiting_job_and_refusals(tmp_path: Path) -> None:
    """The executor is not started, so jobs stay queued until cancelled."""
    service = Service(settings_for(tmp_path))
    submit, other = create_key(service.store, "submit"), create_key(service.store, "submit")
    admin = create_key(service.store, "admin")
    app = create_app(service, manage_service=False)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        jobs = [
            c.post(
                "/v1/studies", files=upload(make_study(tmp_path / n)), headers=auth(submit)
            ).json()
            for n in ("one", "two")
        ]
        assert [j["state"] for j in jobs] == ["queued", "queued"]
        assert [j["queue_position"] for j in jobs] == [0, 1]
        refused = c.delete(f"/v1/jobs/{jobs[0]['id']}", headers=auth(other))
        assert refused.status_code == 403
        cancelled = c.delete(f"/v1/jobs/{jobs[0]['id']}", headers=auth(submit))
        assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
        assert (
            c.get(f"/v1/jobs/{jobs[1]['id']}", headers=auth(submit)).json()["queue_position"] == 0
        )
        again = c.delete(f"/v1/jobs/{jobs[0]['id']}", headers=auth(submit))
        assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_transition"
        # a queued job's report is not ready yet: asking again later answers (retryable)
        waiting = c.get(f"/v1/jobs/{jobs[1]['id']}/report", headers=auth(admin))
        assert waiting.status_code == 409
        assert waiting.json()["error"]["code"] == "result_not_ready"
        assert waiting.json()["error"]["retryable"] is True
        assert "poll GET /v1/jobs/" in waiting.json()["error"]["message"]
        by_admin = c.delete(f"/v1/jobs/{jobs[1]['id']}", headers=auth(admin))
        assert by_admin.json()["state"] == "cancelled"
        report = c.get(f"/v1/jobs/{jobs[1]['id']}/report", headers=auth(admin))
        assert report.status_code == 409 and report.json()["error"]["code"] == "result_not_ready"
        assert report.json()["error"]["retryable"] is False  # a cancelled job never will
    row = service.store.get_job(jobs[0]["id"])
    assert row.state == "cancelled" and row.error_code == "job_cancelled"
    actions = [(r.action, r.subject, r.actor_key_id) for r in service.store.iter_audit()]
    submit_id = submit.split("_")[1]
    assert ("job.cancelled", jobs[0]["id"], submit_id) in actions
    service.store.close()
