"""Issue 11 (item 8 and defect 3): what the gateway knows about a study's completeness
reaches its result.

- ``gateway.late_policy: flag``: instances arriving over a real association (dcmtk
  storescu) after the study's job was created are not re-run but flag the job: a
  ``late_instances`` warning with how many instances and series. Arriving before the
  report stage, it is in report.json, the SR (TEXT "Quality Issue" in TID 1500's
  Qualitative Evaluations, dciodvfy clean, read back) and the FHIR DiagnosticReport's
  conclusion; arriving after the job finished, it is on the job (API) only and the
  recorded result is unchanged.
- A study whose association was aborted and never resumed (pynetdicom) is handed over
  after ``gateway.interrupted_quiet_s`` with a ``study_maybe_incomplete`` warning in
  report, SR and FHIR.

Real peers: radserve's SCP, Orthanc as the result destination, the FHIR stand-in
server, dciodvfy. Skips without Orthanc or dciodvfy."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import highdicom as hd
import pydicom
import pytest
from pydicom.uid import generate_uid
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_net import Orthanc, storescu
from tests.factories.fhir_server import FhirServer
from tests.factories.pacs import pacs_and_gateway
from tests.factories.service import make_study
from tests.factories.waits import wait_until

from radserve.api.schemas import JobOut
from radserve.report.json_report import read_report
from radserve.service import Service
from radserve.store import JobState

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
    pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy is not installed"),
]

QUALITY_ISSUE = "113010"
# Every wait is for a condition, bounded generously (x WAIT_SCALE in wait_until): on a
# loaded 2-core CI machine a job, a FHIR POST or an Orthanc store can take minutes.
WAIT_S = 120.0


@pytest.fixture
def make_peers(tmp_path: Path) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**settings: Any) -> tuple[Service, Orthanc, FhirServer, int]:
            fhir = stack.enter_context(FhirServer())
            orthanc, service = stack.enter_context(
                pacs_and_gateway(
                    tmp_path,
                    fhir__url=fhir.url,
                    fhir__retry_first_s=0.2,
                    fhir__retry_max_s=0.5,
                    **settings,
                )
            )
            assert service.wait_warm(WAIT_S)
            return service, orthanc, fhir, service.settings.gateway.port

        yield start


def _late_series(files: list[Path], folder: Path, count: int) -> list[Path]:
    """``count`` instances of a new series of the same study (copies of its slices)."""
    folder.mkdir(parents=True)
    series = generate_uid()
    out = []
    for i, path in enumerate(files[:count]):
        ds = pydicom.dcmread(path)
        ds.SeriesInstanceUID = series
        ds.SeriesNumber = 77
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        out.append(folder / f"late{i}.dcm")
        ds.save_as(out[-1], enforce_file_format=True)
    return out


def _job(service: Service) -> Any:
    [job] = service.store.list_jobs(limit=10).items
    return job


def _finished(service: Service) -> Any:
    jobs = service.store.list_jobs
    assert wait_until(lambda: any(j.terminal for j in jobs(limit=10).items), WAIT_S, step=0.2)
    job = _job(service)
    assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
    return job


def _sr_notes(path: Path) -> list[str]:
    """TEXT "Quality Issue" values in the SR's root-level Qualitative Evaluations."""
    errors = dciodvfy_errors(path)
    assert errors == [], errors
    sr = hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))
    out = []
    for item in sr.ContentSequence:
        if item.ConceptNameCodeSequence[0].CodeValue != "C0034375":
            continue
        for child in item.ContentSequence:
            if child.ValueType == "TEXT" and child.ConceptNameCodeSequence[0].CodeValue == (
                QUALITY_ISSUE
            ):
                out.append(str(child.TextValue))
    return out


def _conclusion(fhir: FhirServer) -> str:
    assert wait_until(lambda: len(fhir.received) == 1, WAIT_S)
    bundle = fhir.received[0].json()
    resources = [e["resource"] for e in bundle["entry"]]
    [report] = [r for r in resources if r["resourceType"] == "DiagnosticReport"]
    return str(report["conclusion"])


def _warnings(job: Any) -> dict[str, str]:
    return {w.code: w.message for w in JobOut.from_record(job).warnings}


def test_late_instances_while_the_job_runs_mark_report_sr_and_fhir(
    make_peers: Any, tmp_path: Path
) -> None:
    service, orthanc, fhir, port = make_peers(gateway__late_policy="flag")
    session = service.catalog.sessions.get(service.catalog.registry.get("organs-test"), "fp32")
    original, release = session.run, threading.Event()

    def held(batch: Any) -> Any:  # the job stays in inference until the late ones are in
        release.wait(WAIT_S)
        return original(batch)

    session.run = held  # type: ignore[method-assign]
    files = make_study(tmp_path / "study")
    late = _late_series(files, tmp_path / "late", 3)
    try:
        assert storescu("127.0.0.1", port, files, calling="ORTHANC").returncode == 0
        assert wait_until(
            lambda: (
                bool(service.store.list_jobs(limit=1).items)
                and _job(service).state is JobState.RUNNING
            ),
            WAIT_S,
        )
        assert storescu("127.0.0.1", port, late, calling="ORTHANC").returncode == 0
        assert wait_until(lambda: "late_instances" in _warnings(_job(service)), WAIT_S)
    finally:
        release.set()
    job = _finished(service)
    assert len(service.store.list_jobs(limit=10).items) == 1  # flagged, not re-run
    message = _warnings(job)["late_instances"]
    assert "3 instances in 1 series" in message

    report = read_report(Path(str(job.result_path)) / "report.json")
    assert [(w.code, w.message) for w in report.warnings if w.stage == "gateway"] == [
        ("late_instances", message)
    ]
    assert _sr_notes(Path(str(job.result_path)) / "measurements-sr.dcm") == [message]
    assert "3 instances in 1 series arrived after this analysis started" in _conclusion(fhir)
    # the SR with the note reached the PACS
    assert wait_until(lambda: len(orthanc.get("/instances")) >= 2, WAIT_S, step=0.5)


def test_late_instances_after_the_job_finished_flag_the_job_only(
    make_peers: Any, tmp_path: Path
) -> None:
    service, _orthanc, _fhir, port = make_peers(gateway__late_policy="flag")
    files = make_study(tmp_path / "study")
    assert storescu("127.0.0.1", port, files, calling="ORTHANC").returncode == 0
    job = _finished(service)
    report_file = Path(str(job.result_path)) / "report.json"
    before = report_file.read_bytes()
    late = _late_series(files, tmp_path / "late", 2)
    assert storescu("127.0.0.1", port, late, calling="ORTHANC").returncode == 0
    assert wait_until(lambda: "late_instances" in _warnings(_job(service)), WAIT_S)
    assert "2 instances in 1 series" in _warnings(_job(service))["late_instances"]
    assert _job(service).state is JobState.SUCCEEDED
    assert len(service.store.list_jobs(limit=10).items) == 1  # not re-run
    assert report_file.read_bytes() == before  # a recorded result is never rewritten


def test_study_cut_off_and_never_resumed_is_marked_maybe_incomplete(
    make_peers: Any, tmp_path: Path
) -> None:
    service, _orthanc, fhir, port = make_peers(gateway__interrupted_quiet_s=2.0)
    files = make_study(tmp_path / "study")
    ae = AE("ORTHANC")
    ae.add_requested_context(CTImageStorage, ["1.2.840.10008.1.2.1"])
    assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
    assert assoc.is_established
    for path in files[:-2]:
        assert int(assoc.send_c_store(str(path)).Status) == 0
    assoc.abort()  # cut off; the sender never comes back

    job = _finished(service)
    message = _warnings(job)["study_maybe_incomplete"]
    assert "cut off" in message
    report = read_report(Path(str(job.result_path)) / "report.json")
    assert ("study_maybe_incomplete", message) in [(w.code, w.message) for w in report.warnings]
    assert _sr_notes(Path(str(job.result_path)) / "measurements-sr.dcm") == [message]
    assert "may be incomplete" in _conclusion(fhir)
