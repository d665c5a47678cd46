"""Issue 11, defect 4: a job that fails after the gateway accepted its study tells the PACS:
a Comprehensive 3D SR "AI analysis failed" with the error code and reason arrives in the
source study at the PACS (Orthanc started here), passes dciodvfy, reads back with
highdicom; pushed back with the study, it is recognised as radserve's own object and
never becomes input. With ``results.failure_notice: none`` nothing is sent.

The fault is injected as in tests/integration/test_failure_notice.py: the model session
raises. Skips without Orthanc or dciodvfy."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import highdicom as hd
import pydicom
import pytest
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_net import Orthanc
from tests.factories.pacs import pacs_and_gateway
from tests.factories.service import make_study
from tests.factories.waits import wait_until

from radserve.errors import InferenceError
from radserve.report.dicom import notes
from radserve.service import Service
from radserve.store import JobState

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
    pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy is not installed"),
]

SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"


@pytest.fixture
def make_peers(tmp_path: Path) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**settings: Any) -> tuple[Orthanc, Service]:
            # the broken model's error is retryable: both retries still run, 0.1 s apart
            # instead of the default 5 s each (10 s a test spent waiting)
            settings = {"jobs__retry_backoff_s": 0.1, **settings}
            return stack.enter_context(pacs_and_gateway(tmp_path, warm=True, **settings))

        yield start


def _break_model(service: Service) -> None:
    session = service.catalog.sessions.get(service.catalog.registry.get("organs-test"), "fp32")

    def broken(batch: Any) -> Any:
        raise InferenceError("device lost (test)")

    session.run = broken  # type: ignore[method-assign]


def _jobs(service: Service, count: int) -> list[Any]:
    def done() -> bool:
        jobs = service.store.list_jobs(limit=10).items
        return len(jobs) >= count and all(j.terminal for j in jobs)

    assert wait_until(done, 90)
    return list(reversed(service.store.list_jobs(limit=10).items))  # oldest first


def _orthanc_srs(orthanc: Orthanc, study_id: str) -> list[str]:
    return [
        i["ID"]
        for i in orthanc.get(f"/studies/{study_id}/instances")
        if orthanc.get(f"/instances/{i['ID']}/simplified-tags").get("SOPClassUID") == SR_3D
    ]


def _texts(sr: hd.sr.Comprehensive3DSR) -> dict[str, str]:
    [container] = [
        item
        for item in sr.ContentSequence
        if item.ConceptNameCodeSequence[0].CodeValue == "C0034375"
    ]
    out = {}
    for item in container.ContentSequence:
        name = item.ConceptNameCodeSequence[0].CodeValue
        if item.ValueType == "TEXT":
            out[name] = str(item.TextValue)
        elif item.ValueType == "CODE":
            out[name] = str(item.ConceptCodeSequence[0].CodeValue)
    return out


def test_failed_job_sends_an_sr_to_the_pacs(make_peers: Any, tmp_path: Path) -> None:
    orthanc, service = make_peers()  # failure_notice: default (both; no FHIR server here)
    _break_model(service)
    files = make_study(
        tmp_path / "study",
        extra={"PatientID": "PID-0815", "PatientName": "Doe^Jane", "PatientBirthDate": "19700101"},
    )
    source = pydicom.dcmread(files[0], stop_before_pixels=True)
    study_id = orthanc.upload(files)
    orthanc.push("radserve", [study_id])
    [failed] = _jobs(service, 1)
    assert failed.state is JobState.FAILED, failed.state

    assert wait_until(lambda: len(_orthanc_srs(orthanc, study_id)) == 1, 60)
    [sr_id] = _orthanc_srs(orthanc, study_id)
    path = tmp_path / "notice.dcm"
    path.write_bytes(orthanc.file(sr_id))
    errors = dciodvfy_errors(path)
    assert errors == [], errors

    sr = hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))
    assert sr.StudyInstanceUID == source.StudyInstanceUID  # in the source study
    assert sr.PatientID == "PID-0815" and str(sr.PatientName) == "Doe^Jane"
    assert sr.PatientBirthDate == ""  # the study's identifiers only
    assert (sr.CompletionFlag, sr.VerificationFlag) == ("COMPLETE", "UNVERIFIED")
    assert sr.Manufacturer == "radserve"
    assert sr.ContributingEquipmentSequence[0].Manufacturer == "radserve"
    texts = _texts(sr)
    assert texts[notes.ANALYSIS_STATUS.value] == notes.ANALYSIS_FAILED.value
    assert texts[notes.ERROR_CODE.value] == failed.error_code
    assert failed.error_code in texts[notes.FAILURE_REASON.value]
    assert "analysis failed" in texts[notes.FAILURE_REASON.value]
    assert (
        'radserve_failure_notices_total{channel="sr"} 1.0' in service.metrics.exposition().decode()
    )

    # the PACS pushes the study again, now with radserve's failure SR in it: the SR is
    # acknowledged as radserve's own object and never filed as input (the images are
    # duplicates of a study handed over already: nothing reopens, no new job)
    orthanc.push("radserve", [study_id])
    assert service.own_results.counts().get("C-STORE", 0) == 1
    assert service.gateway is not None
    incoming = service.gateway.scp.instances.study_dir(str(source.StudyInstanceUID))
    assert sorted(p.name for p in incoming.glob("*.dcm")) == sorted(
        f"{pydicom.dcmread(f, stop_before_pixels=True).SOPInstanceUID}.dcm" for f in files
    )
    assert service.gateway.scp.tracker.pending() == []
    assert len(service.store.list_jobs(limit=10).items) == 1


def test_failure_notice_none_sends_nothing_to_the_pacs(make_peers: Any, tmp_path: Path) -> None:
    orthanc, service = make_peers(results__failure_notice="none")
    _break_model(service)
    study_id = orthanc.upload(make_study(tmp_path / "study"))
    orthanc.push("radserve", [study_id])
    [failed] = _jobs(service, 1)
    assert failed.state is JobState.FAILED
    assert service.outbox.items(kind="dicom") == []
    assert not (Path(service.intake.results_root) / failed.id / "failure-notice-sr.dcm").exists()
    assert _orthanc_srs(orthanc, study_id) == []
    assert 'radserve_failure_notices_total{channel="sr"}' not in (
        service.metrics.exposition().decode()
    )
