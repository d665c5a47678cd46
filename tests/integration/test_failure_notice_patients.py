"""Failure notices and job errors through a real server (``POST /v1/studies`` of a zip,
a FHIR server on loopback), for the two findings of the operator trial (t-ops, #2, #3):

- a study whose instances name two patients fails with ``attribute_invalid``; its
  cancelled DiagnosticReport went out anyway, under the first file's patient. Now no
  notice is sent and ``failure_notice_unaddressable`` is counted;
- a zip whose folder names the patient (``ZZTESTNAME^ZZ ZZPID123 19010203/CT/``, as
  PACS exports do): its member path, and the server's data dir, were in the job error a
  read key sees and in the notice's conclusion. Now neither they nor the log hold them.
"""

from __future__ import annotations

import io
import logging
import zipfile
from pathlib import Path

import httpx
import pydicom
import pytest
from tests.factories.fhir_server import FhirServer
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.service import Service

FOLDER = "ZZTESTNAME^ZZ ZZPID123 19010203/CT"
PLANTED = ("ZZTESTNAME", "ZZPID123", "19010203", "ZZOTHER", "ZZPID999")


def _zip(paths: list[Path]) -> list[tuple[str, tuple[str, bytes, str]]]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for n, path in enumerate(paths):
            zf.write(path, f"{FOLDER}/{n:03d}.dcm")
    return [("files", ("export.zip", buffer.getvalue(), "application/zip"))]


def _edit(path: Path, **values: str) -> None:
    ds = pydicom.dcmread(path)
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    ds.save_as(path, enforce_file_format=True)


def _metric(c: httpx.Client, line: str) -> bool:
    return line in c.get("/metrics").text


def test_no_notice_under_one_patient_for_a_study_naming_two_and_no_paths_anywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with FhirServer() as fhir:
        service = Service(settings_for(tmp_path, fhir__url=fhir.url))
        admin, read = create_key(service.store, "admin"), create_key(service.store, "read")
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=30) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            extra = {"PatientID": "ZZPID123", "PatientName": "ZZTESTNAME^ZZ"}
            # every other instance names another patient
            two = make_study(tmp_path / "two", extra=extra)
            for path in two[1::2]:
                _edit(path, PatientID="ZZPID999", PatientName="ZZOTHER^ZZ")
            r = c.post("/v1/studies", files=_zip(two), headers=auth(admin))
            assert r.status_code == 202, r.text
            failed = wait_job(c, r.json()["id"], read)
            assert failed["error"]["code"] == "attribute_invalid", failed
            assert "different patients" in failed["error"]["message"]
            unaddressable = 'radserve_errors_total{code="failure_notice_unaddressable"} 1.0'
            until(lambda: _metric(c, unaddressable), "the notice counted unaddressable", 30)
            assert service.outbox.items(kind="fhir") == []

            # one patient, one instance whose Modality contradicts its SOP Class
            mixed = make_study(tmp_path / "mixed", extra=extra)
            _edit(mixed[2], Modality="MR")
            r = c.post("/v1/studies", files=_zip(mixed), headers=auth(admin))
            failed = wait_job(c, r.json()["id"], read)  # a read key: no patient data
            error = failed["error"]["message"]
            assert failed["error"]["code"] == "instance_invalid", failed
            uid = pydicom.dcmread(mixed[2], stop_before_pixels=True).SOPInstanceUID
            assert error.startswith(f"instance 3 (SOP Instance UID {uid}): "), error
            until(lambda: len(fhir.received) >= 1, "the notice of the second study", 60)
            [notice] = [r.json() for r in fhir.received]
            [report] = [
                e["resource"]
                for e in notice["entry"]
                if e["resource"]["resourceType"] == "DiagnosticReport"
            ]
            assert error in report["conclusion"]
            data = str(tmp_path / "data")
            for text in (error, report["conclusion"]):
                for planted in (*PLANTED, data, "studies/", ".zip!", "000.dcm"):
                    assert planted not in text, (planted, text)
            for planted in (*PLANTED, ".zip!", "000.dcm"):  # the log: the data dir may be said
                assert planted not in caplog.text, planted
    assert len(fhir.received) == 1
