"""DICOMweb against the real server (uvicorn on loopback, httpx): STOW-RS stores a study
and runs its job, WADO-RS serves the SEG and SR it produced; bad requests get the
PS3.18 status codes; the quiet period joins a study sent in several requests; no
patient data reaches the logs."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from tests.factories.dicomweb import (
    dicom_parts,
    failures,
    job_of,
    referenced,
    related,
    sop_uids,
    split_related,
    stow,
)
from tests.factories.service import (
    auth,
    live_server,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import until

from radserve.errors import is_study_fault
from radserve.service import Service

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"
PHI = {"PatientName": "Geheim^Gertrud", "PatientID": "PID-DW-7731", "PatientBirthDate": "19510203"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("dicomweb")
    # Only the several-requests test waits for the quiet period; 0.5 s let a loaded host
    # (load 11) start a job between the two halves of its study.
    with live_server(settings_for(root, dicomweb__quiet_s=3.0)) as live:
        yield live


def test_stow_runs_the_study_and_wado_serves_its_seg_and_sr(
    server: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    c, reader = server["client"], auth(server["read"])
    files = make_study(tmp_path / "study", extra=PHI)
    study_uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)

    r = stow(server, dicom_parts(files), path=f"/dicomweb/studies/{study_uid}")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/dicom+json"
    assert sorted(referenced(r)) == sorted(sop_uids(files)) and failures(r) == []
    assert r.json()["0020000D"]["Value"] == [study_uid]
    job = wait_job(c, job_of(r), server["submit"])
    assert job["state"] == "succeeded", job

    metadata = c.get(f"/dicomweb/studies/{study_uid}/metadata", headers=reader)
    assert metadata.status_code == 200 and metadata.headers["content-type"] == (
        "application/dicom+json"
    )
    headers = [pydicom.Dataset.from_json(d) for d in metadata.json()]
    assert {str(h.SOPClassUID) for h in headers} == {SEG, SR_3D}
    assert {str(h.StudyInstanceUID) for h in headers} == {study_uid}
    assert all("PixelData" not in h for h in headers)
    assert str(headers[0].PatientID) == PHI["PatientID"]  # the result is in the patient's study

    whole = c.get(f"/dicomweb/studies/{study_uid}", headers=reader)
    assert whole.status_code == 200
    parts = split_related(whole)
    assert {media for media, _ in parts} == {
        "application/dicom; transfer-syntax=1.2.840.10008.1.2.1"
    }
    retrieved = [pydicom.dcmread(io.BytesIO(data)) for _, data in parts]
    assert sorted(str(d.SOPInstanceUID) for d in retrieved) == sorted(
        str(h.SOPInstanceUID) for h in headers
    )
    result_dir = Path(server["service"].jobs.get(job["id"]).result_path or "")
    on_disk = {
        str(pydicom.dcmread(p).SOPInstanceUID): p.read_bytes() for p in result_dir.glob("*.dcm")
    }
    assert {
        str(d.SOPInstanceUID): data for d, (_, data) in zip(retrieved, parts, strict=True)
    } == on_disk

    seg = next(d for d in retrieved if str(d.SOPClassUID) == SEG)
    series, instance = str(seg.SeriesInstanceUID), str(seg.SOPInstanceUID)
    by_series = split_related(
        c.get(f"/dicomweb/studies/{study_uid}/series/{series}", headers=reader)
    )
    assert {str(pydicom.dcmread(io.BytesIO(d)).SeriesInstanceUID) for _, d in by_series} == {series}
    one = c.get(
        f"/dicomweb/studies/{study_uid}/series/{series}/instances/{instance}",
        headers={
            **reader,
            "Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*',
        },
    )
    ((_, data),) = split_related(one)
    assert pydicom.dcmread(io.BytesIO(data)).SOPInstanceUID == instance
    meta = c.get(
        f"/dicomweb/studies/{study_uid}/series/{series}/instances/{instance}/metadata",
        headers={**reader, "Accept": "application/dicom+json"},
    ).json()
    assert [d["00080018"]["Value"][0] for d in meta] == [instance]
    series_meta = c.get(f"/dicomweb/studies/{study_uid}/series/{series}/metadata", headers=reader)
    assert {d["0020000E"]["Value"][0] for d in series_meta.json()} == {series}

    # patient data never reaches the logs, whichever route the study took
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "dicomweb" in logged.lower() or "STOW" in logged
    for value in (*PHI.values(), "Geheim", "Gertrud"):
        assert value not in logged


def test_wado_unknown_uids_404_and_unacceptable_accept_406(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, reader = server["client"], auth(server["read"])
    files = make_study(tmp_path / "study")
    r = stow(server, dicom_parts(files))
    job = wait_job(c, job_of(r), server["submit"])
    assert job["state"] == "succeeded", job
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    meta = c.get(f"/dicomweb/studies/{study}/metadata", headers=reader).json()
    series, instance = meta[0]["0020000E"]["Value"][0], meta[0]["00080018"]["Value"][0]
    source_series = str(pydicom.dcmread(files[0], stop_before_pixels=True).SeriesInstanceUID)

    for path in (
        "/dicomweb/studies/1.2.3.999",
        "/dicomweb/studies/1.2.3.999/metadata",
        f"/dicomweb/studies/{study}/series/1.2.3.999",
        f"/dicomweb/studies/{study}/series/{source_series}",  # received images: not served
        f"/dicomweb/studies/{study}/series/{series}/instances/1.2.3.999",
        f"/dicomweb/studies/{study}/series/{series}/instances/1.2.3.999/metadata",
        f"/dicomweb/studies/1.2.3.999/series/{series}/instances/{instance}",
    ):
        r = c.get(path, headers=reader)
        assert r.status_code == 404, path
        assert r.json()["error"]["code"] == "not_found"

    instance_url = f"/dicomweb/studies/{study}/series/{series}/instances/{instance}"
    for accept in (
        "application/dicom+xml",
        "image/jpeg",
        'multipart/related; type="image/jpeg"',
        'multipart/related; type="application/dicom"; transfer-syntax=1.2.840.10008.1.2.4.50',
        "*/*;q=0",
    ):
        r = c.get(instance_url, headers={**reader, "Accept": accept})
        assert r.status_code == 406, accept
        assert r.json()["error"]["code"] == "not_acceptable"
    r = c.get(f"{instance_url}/metadata", headers={**reader, "Accept": "application/dicom+xml"})
    assert r.status_code == 406
    for accept in ("*/*", "multipart/related", "application/json, multipart/*;q=0.5"):
        assert c.get(instance_url, headers={**reader, "Accept": accept}).status_code == 200, accept

    assert c.get(instance_url).status_code == 401
    assert c.get(instance_url, headers={"X-API-Key": "nope"}).status_code == 401


def test_stow_refuses_what_it_cannot_store(server: dict[str, Any], tmp_path: Path) -> None:
    c = server["client"]
    service: Service = server["service"]
    files = make_study(tmp_path / "study", n_slices=4)
    jobs_before = len(service.store.list_jobs(limit=1000).items)
    good = dicom_parts(files)

    # wrong media types: 415
    for content_type in (
        "application/dicom",
        "multipart/form-data; boundary=x",
        'multipart/related; type="application/dicom+json"; boundary=x',
        'multipart/related; type="application/dicom+xml"; boundary=x',
    ):
        r = c.post(
            "/dicomweb/studies",
            content=b"--x--\r\n",
            headers={"Content-Type": content_type, **auth(server["submit"])},
        )
        assert r.status_code == 415, content_type
        assert r.json()["error"]["code"] == "unsupported_media_type"

    # malformed bodies: 400
    body, content_type = related(good)
    no_boundary = 'multipart/related; type="application/dicom"'
    r = c.post(
        "/dicomweb/studies",
        content=body,
        headers={"Content-Type": no_boundary, **auth(server["submit"])},
    )
    assert r.status_code == 400
    truncated_body, content_type = related(good, close=False)
    r = c.post(
        "/dicomweb/studies",
        content=truncated_body[: len(truncated_body) // 2],
        headers={"Content-Type": content_type, **auth(server["submit"])},
    )
    assert r.status_code == 400, r.text
    r = c.post(
        "/dicomweb/studies",
        content=b"this is not multipart at all",
        headers={"Content-Type": content_type, **auth(server["submit"])},
    )
    assert r.status_code == 400
    assert len(service.store.list_jobs(limit=1000).items) == jobs_before  # nothing started

    # a non-DICOM part among good ones: 202, it alone failed (0xC000)
    r = stow(server, [*good, (b"\x89PNG\r\n\x1a\n not dicom", "application/dicom")])
    assert r.status_code == 202, r.text
    assert sorted(referenced(r)) == sorted(sop_uids(files))
    assert failures(r) == [(None, 0xC000)]
    assert wait_job(c, job_of(r), server["submit"])["state"] == "succeeded"

    # only non-DICOM parts, or parts of another media type: 409, nothing stored
    r = stow(server, [(b"plain text", "text/plain"), (b"\x00" * 300, "application/dicom")])
    assert r.status_code == 409
    assert failures(r) == [(None, 0xC000), (None, 0xC000)] and referenced(r) == []
    assert "link" not in r.headers

    # instances of another study than the target: 409, 0xC409
    other = "1.2.826.0.1.3680043.8.498.1"
    r = stow(server, good, path=f"/dicomweb/studies/{other}")
    assert r.status_code == 409
    assert sorted(failures(r)) == sorted((uid, 0xC409) for uid in sop_uids(files))

    # a SOP class radserve does not process: 0x0122; an unaccepted transfer syntax: 0xC122
    sr = pydicom.dcmread(files[0])
    sr.SOPClassUID = sr.file_meta.MediaStorageSOPClassUID = SR_3D
    sr.SOPInstanceUID = sr.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    video = pydicom.dcmread(files[1])
    video.SOPInstanceUID = video.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    video.file_meta.TransferSyntaxUID = pydicom.uid.MPEG2MPML
    del video.PixelData  # the header is what is checked
    jpeg12 = pydicom.dcmread(files[2])  # refused on purpose: no licence-fit 12-bit decoder
    jpeg12.SOPInstanceUID = jpeg12.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    jpeg12.file_meta.TransferSyntaxUID = pydicom.uid.JPEGExtended12Bit
    del jpeg12.PixelData
    encoded = []
    for ds in (sr, video, jpeg12):
        buffer = io.BytesIO()
        ds.save_as(buffer, enforce_file_format=True)
        encoded.append((buffer.getvalue(), "application/dicom"))
    r = stow(server, encoded)
    assert r.status_code == 409
    assert failures(r) == [
        (str(sr.SOPInstanceUID), 0x0122),
        (str(video.SOPInstanceUID), 0xC122),
        (str(jpeg12.SOPInstanceUID), 0xC122),
    ]

    # no key: 401; a read key may not store: 403; an Accept without DICOM JSON: 406
    body, content_type = related(good)
    assert (
        c.post(
            "/dicomweb/studies", content=body, headers={"Content-Type": content_type}
        ).status_code
        == 401
    )
    r = c.post(
        "/dicomweb/studies",
        content=body,
        headers={"Content-Type": content_type, **auth(server["read"])},
    )
    assert r.status_code == 403
    r = stow(server, good, headers={"Accept": "application/dicom+xml"})
    assert r.status_code == 406


def test_a_study_sent_in_several_requests_waits_for_the_quiet_period(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, service = server["client"], server["service"]
    files = make_study(tmp_path / "study")
    before = {j.id for j in service.store.list_jobs(limit=1000).items}
    halves = (files[: len(files) // 2], files[len(files) // 2 :])
    for half in halves:
        r = stow(server, dicom_parts(half), params={"complete": "false"})
        assert r.status_code == 200 and "link" not in r.headers
        assert sorted(referenced(r)) == sorted(sop_uids(half))
    r = stow(server, dicom_parts(files[:1]), params={"complete": "false", "priority": "urgent"})
    assert r.status_code == 400  # a priority needs a complete study

    def new_jobs() -> list[Any]:
        return [j for j in service.store.list_jobs(limit=1000).items if j.id not in before]

    (job,) = until(  # one job for the whole study
        lambda: (new := new_jobs()) and new[0].state.value in ("succeeded", "failed") and new,
        "the study's job to end",
        60,
        state=new_jobs,
    )
    assert job.state.value == "succeeded", job
    assert job.queue_meta["source"] == "dicomweb"
    stored = {p.name for p in Path(job.study_path).iterdir()}
    assert len(stored) == len(files)
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    assert (
        c.get(f"/dicomweb/studies/{study}/metadata", headers=auth(server["read"])).status_code
        == 200
    )


def test_a_study_uploaded_over_rest_is_answered_from_the_cache_for_dicomweb(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """A cached result made for an HTTP upload (no SEG/SR) answers a DICOMweb client
    too: its SEG and SR are written from the cached report and label maps, no model
    runs again, and WADO-RS serves them (the same instances however often asked)."""
    c, reader = server["client"], auth(server["read"])
    files = make_study(tmp_path / "study")
    first = c.post("/v1/studies", files=upload(files), headers=auth(server["submit"])).json()
    assert wait_job(c, first["id"], server["submit"])["state"] == "succeeded"
    first_dir = Path(server["service"].jobs.get(first["id"]).result_path or "")
    assert not list(first_dir.glob("*.dcm"))
    r = stow(server, dicom_parts(files))
    assert r.status_code == 200
    job = wait_job(c, job_of(r), server["submit"])
    assert job["state"] == "succeeded" and job["cached_from"] == first["id"], job
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    metadata = c.get(f"/dicomweb/studies/{study}/metadata", headers=reader)
    assert metadata.status_code == 200
    served = sorted(pydicom.Dataset.from_json(d).SOPInstanceUID for d in metadata.json())
    assert {str(pydicom.Dataset.from_json(d).SOPClassUID) for d in metadata.json()} == {
        SEG,
        SR_3D,
    }
    # the same study stored again: the same result, the same instances, nothing new
    again = wait_job(c, job_of(stow(server, dicom_parts(files))), server["submit"])
    assert again["cached_from"] == first["id"]
    metadata = c.get(f"/dicomweb/studies/{study}/metadata", headers=reader)
    assert sorted(pydicom.Dataset.from_json(d).SOPInstanceUID for d in metadata.json()) == served


def test_a_study_resampled_on_ingest_is_the_study_s_refusal_when_results_go_back_as_dicom(
    tmp_path: Path,
) -> None:
    """A series with a gap, resampled as the site asks, has no source images per slice
    for a SEG to reference: refused before inference as the study's shape under the
    site's settings (was ``report_failed``, radserve's own failure, counted against a
    canary); the same study uploaded over REST (no DICOM results) is analysed."""
    settings = settings_for(tmp_path, ingest__missing_slices="resample")
    files = make_study(tmp_path / "study")
    files[len(files) // 2].unlink()  # one slice missing: a gap of twice the spacing
    kept = [p for p in files if p.exists()]
    with live_server(settings) as live:
        r = stow(live, dicom_parts(kept))
        assert r.status_code == 200, r.text
        job = wait_job(live["client"], job_of(r), live["submit"])
        assert job["state"] == "failed", job
        assert job["error"]["code"] == "source_frames_unsupported", job
        assert "resampled on ingest" in job["error"]["message"]
        assert is_study_fault(job["error"]["code"])
        uploaded = live["client"].post(
            "/v1/studies", files=upload(kept), headers=auth(live["submit"])
        )
        done = wait_job(live["client"], uploaded.json()["id"], live["submit"])
        assert done["state"] == "succeeded", done
