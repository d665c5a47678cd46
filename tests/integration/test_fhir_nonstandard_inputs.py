"""FHIR for inputs that are not a folder of DICOM files, against a real FHIR server
stand-in: a NIfTI volume has no DICOM study, so it is offered no FHIR Bundle (409
``no_dicom_study``, never a 500) and queues none; a study uploaded as one zip that fails
still sends its failure notice (the header is read from inside the zip); and an empty
zip is an upload of no files (400 ``empty_upload``), not an unknown media type."""

from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pydicom
import pytest
from tests.factories.fhir_server import FhirServer
from tests.factories.service import auth, live_server, make_study, settings_for, wait_job
from tests.factories.waits import until

from radserve.ingest import discover_series, load_series, save_nifti
from radserve.report.fhir import check_bundle


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("fhir-nonstandard")
    with FhirServer() as fhir, live_server(settings_for(root, fhir__url=fhir.url)) as live:
        yield {**live, "fhir": fhir}


def _nifti(tmp_path: Path) -> bytes:
    make_study(tmp_path / "study")
    volume = load_series(discover_series(tmp_path / "study")[0]).volume
    save_nifti(volume, tmp_path / "ct.nii.gz")
    return (tmp_path / "ct.nii.gz").read_bytes()


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_nifti_job_offers_no_fhir_bundle_and_queues_none(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    part = [("files", ("ct.nii.gz", _nifti(tmp_path), "application/gzip"))]
    r = c.post("/v1/studies", files=part, headers=auth(key))
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"], key)
    assert job["state"] == "succeeded", job
    assert "fhir" not in job["links"] and {"report", "labels"} <= set(job["links"])
    listed = c.get("/v1/jobs", headers=auth(key)).json()["items"]
    assert "fhir" not in next(j for j in listed if j["id"] == job["id"])["links"]

    answer = c.get(f"/v1/jobs/{job['id']}/fhir", headers=auth(key))
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "no_dicom_study"
    assert server["service"].outbox.items(kind="fhir", job_id=job["id"]) == []
    metrics = c.get("/metrics").text
    assert 'radserve_errors_total{code="report_failed"}' not in metrics

    # the other side of the rule: a DICOM study (here one zip) links its Bundle, sends it
    files = make_study(tmp_path / "dicom")
    parts = [("files", ("s.zip", _zip({p.name: p.read_bytes() for p in files}), "application/zip"))]
    dicom = wait_job(c, c.post("/v1/studies", files=parts, headers=auth(key)).json()["id"], key)
    assert dicom["state"] == "succeeded", dicom
    assert dicom["links"]["fhir"] == f"/v1/jobs/{dicom['id']}/fhir"
    bundle = c.get(dicom["links"]["fhir"], headers=auth(key))
    assert bundle.status_code == 200 and check_bundle(bundle.json()) == []
    until(
        lambda: server["service"].outbox.items(kind="fhir", job_id=dicom["id"]) != [],
        "the DICOM job's Bundle queued",
        30,
    )


def test_a_failed_nifti_job_fails_its_notice_quietly(
    server: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No patient or study to name: no notice is built, and none is counted as failed."""
    caplog.set_level(logging.INFO, logger="radserve.service.failure_notice")
    c, key = server["client"], server["submit"]
    metre = nib.Nifti1Image(np.full((64, 64, 24), -1000, np.int16), np.diag([1e3, 1e3, 1e3, 1]))
    nib.save(metre, tmp_path / "metre.nii.gz")
    part = [
        (
            "files",
            ("metre.nii.gz", (tmp_path / "metre.nii.gz").read_bytes(), "application/octet-stream"),
        )
    ]
    r = c.post("/v1/studies", files=part, headers=auth(key))
    job = wait_job(c, r.json()["id"], key)
    assert job["state"] == "failed", job

    def said(text: str) -> bool:
        return any(job["id"] in m and text in m for m in (r.getMessage() for r in caplog.records))

    until(lambda: said("no FHIR failure notice"), "the notice skipped", 30)
    assert not said("was not queued")
    assert 'radserve_errors_total{code="failure_notice_failed"}' not in c.get("/metrics").text
    assert server["service"].outbox.items(kind="fhir", job_id=job["id"]) == []


def test_a_failed_zip_upload_sends_its_failure_notice(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """A zip is stored as it came: the notice's header is read from inside it."""
    c, key, fhir = server["client"], server["submit"], server["fhir"]
    files = make_study(tmp_path / "gap", extra={"PatientID": "PID-ZIP-7"})
    del files[5]  # a missing slice: ingest.missing_slices reject (the default) fails it
    study_uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    parts = [
        (
            "files",
            ("gap.zip", _zip({p.name: p.read_bytes() for p in files}), "application/octet-stream"),
        )
    ]
    r = c.post("/v1/studies", files=parts, headers=auth(key))
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"], key)
    assert job["state"] == "failed", job

    def notice() -> list[Any]:
        return server["service"].outbox.items(kind="fhir", job_id=job["id"])

    until(lambda: notice() != [], "the failure notice queued", 30)
    [item] = notice()
    assert item.study_instance_uid == study_uid
    until(lambda: any(item.sop_instance_uid in r.body.decode() for r in fhir.received), "sent", 30)
    [bundle] = [r.json() for r in fhir.received if r.json()["id"] == item.sop_instance_uid]
    assert check_bundle(bundle) == []
    kinds = {e["resource"]["resourceType"]: e["resource"] for e in bundle["entry"]}
    assert kinds["DiagnosticReport"]["status"] == "cancelled"
    assert job["error"]["code"] in kinds["DiagnosticReport"]["conclusion"]
    assert [i["value"] for i in kinds["Patient"]["identifier"]] == ["PID-ZIP-7"]


@pytest.mark.parametrize(
    "archive",
    [_zip({}), _zip({"study/": b""})],
    ids=["no-members", "only-a-folder"],
)
def test_a_zip_holding_no_files_is_an_empty_upload_at_every_door(
    server: dict[str, Any], archive: bytes
) -> None:
    c, key = server["client"], server["submit"]
    part = ("empty.zip", archive, "application/zip")
    single = c.post("/v1/studies", files=[("files", part)], headers=auth(key))
    assert single.status_code == 400, single.text
    assert single.json()["error"]["code"] == "empty_upload"
    assert "zip archive that holds no files" in single.json()["error"]["message"]
    batch = c.post("/v1/studies/batch", files=[("study-a", part)], headers=auth(key))
    assert batch.status_code == 207, batch.text
    [item] = batch.json()["items"]
    assert item["status"] == 400 and item["error"]["code"] == "empty_upload"
