"""A study that reaches radserve in two halves (the PACS pushed the first half, then the
whole study once the rest arrived) gets two results, and the second supersedes the
first: its SR names the first SR in the Predecessor Documents Sequence, its series have
their own numbers and say which version is current, the lesion keeps its tracking UID,
and the FHIR DiagnosticReport is amended (same identifier, conditional update) instead
of a second one being created.

Real peers: Orthanc on private loopback ports as the PACS, the FHIR stand-in server,
highdicom reading the SRs back, dciodvfy checking them. Skips without Orthanc."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import highdicom as hd
import pydicom
import pytest
from tests.factories.dicom_net import Orthanc, free_port
from tests.factories.fhir_server import FhirServer
from tests.factories.service import make_study, settings_for
from tests.factories.waits import wait_until

from radserve.service import Service
from radserve.store import JobState

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
]

SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"
# Every wait is for a condition, bounded generously (x WAIT_SCALE in wait_until): on a
# loaded 2-core CI machine a job, a FHIR POST or an Orthanc store can take minutes.
WAIT_S = 120.0


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[tuple[Orthanc, Service, FhirServer]]:
    gateway_port = free_port()
    orthanc = Orthanc(
        tmp_path / "orthanc", peers={"radserve": ["RADSERVE", "127.0.0.1", gateway_port]}
    )
    with FhirServer() as fhir:
        settings = settings_for(
            tmp_path,
            gateway__enabled=True,
            gateway__port=gateway_port,
            gateway__allowed_peers=[
                {"ae_title": "ORTHANC", "host": "127.0.0.1", "port": orthanc.dicom_port}
            ],
            results__secondary_capture_key_images=True,
            fhir__url=fhir.url,
            fhir__retry_first_s=0.2,
            fhir__retry_max_s=0.5,
        )
        service = Service(settings, gateway_options={"quiet_s": 0.5})
        orthanc.start()
        service.start()
        try:
            yield orthanc, service, fhir
        finally:
            service.stop()
            orthanc.stop()


def _succeeded(service: Service, count: int) -> list[Any]:
    def done() -> bool:
        jobs = service.store.list_jobs(limit=10).items
        return len(jobs) >= count and all(j.terminal for j in jobs)

    assert wait_until(done, WAIT_S, step=0.2)
    jobs = service.store.list_jobs(limit=10).items
    assert len(jobs) == count and all(j.state is JobState.SUCCEEDED for j in jobs), [
        (j.state, j.error_code, j.error_message) for j in jobs
    ]
    return list(reversed(jobs))  # oldest first


def _results(job: Any) -> dict[str, pydicom.Dataset]:
    return {p.name: pydicom.dcmread(p) for p in sorted(Path(str(job.result_path)).glob("*.dcm"))}


def _sr(job: Any) -> tuple[Path, hd.sr.Comprehensive3DSR]:
    path = Path(str(job.result_path)) / "measurements-sr.dcm"
    return path, hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))


def _lesion_tracking_uids(sr: hd.sr.Comprehensive3DSR) -> set[str]:
    groups = sr.content.get_volumetric_roi_measurement_groups()
    return {str(g.tracking_uid) for g in groups if str(g.tracking_identifier).startswith("Lesion")}


def _diagnostic_report(bundle: dict[str, Any]) -> dict[str, Any]:
    [entry] = [e for e in bundle["entry"] if e["resource"]["resourceType"] == "DiagnosticReport"]
    return entry  # type: ignore[no-any-return]


def test_second_half_of_a_study_supersedes_the_first_result(
    peers: tuple[Orthanc, Service, FhirServer], tmp_path: Path
) -> None:
    orthanc, service, fhir = peers
    files = make_study(tmp_path / "study")
    by_z = sorted(files, key=lambda p: float(pydicom.dcmread(p).ImagePositionPatient[2]))
    first_half, second_half = by_z[:7], by_z[7:]

    study_id = orthanc.upload(first_half)
    orthanc.push("radserve", [study_id])
    [first] = _succeeded(service, 1)
    assert wait_until(lambda: len(fhir.received) == 1, WAIT_S)
    # the rest reaches the PACS; it pushes the whole study again (with radserve's results)
    orthanc.upload(second_half)
    orthanc.push("radserve", [study_id])
    first, second = _succeeded(service, 2)
    assert wait_until(lambda: len(fhir.received) == 2, WAIT_S)

    old_path, old_sr = _sr(first)
    new_path, new_sr = _sr(second)
    [predecessor] = new_sr.PredecessorDocumentsSequence
    assert predecessor.StudyInstanceUID == old_sr.StudyInstanceUID
    [series] = predecessor.ReferencedSeriesSequence
    assert series.SeriesInstanceUID == old_sr.SeriesInstanceUID
    [instance] = series.ReferencedSOPSequence
    assert (instance.ReferencedSOPClassUID, instance.ReferencedSOPInstanceUID) == (
        SR_3D,
        old_sr.SOPInstanceUID,
    )
    assert "PredecessorDocumentsSequence" not in old_sr
    # the lesion is the same lesion in both results
    old_uids, new_uids = _lesion_tracking_uids(old_sr), _lesion_tracking_uids(new_sr)
    assert len(new_uids) == 1 and old_uids == new_uids
    old_seg = _results(first)["findings-seg.dcm"]
    new_seg = _results(second)["findings-seg.dcm"]
    assert {s.TrackingUID for s in old_seg.SegmentSequence} == new_uids
    assert {s.TrackingUID for s in new_seg.SegmentSequence} == new_uids
    # every series of the new result has its own number and says it is the current one
    old_series = {(d.Modality, int(d.SeriesNumber)) for d in _results(first).values()}
    new_series = {(d.Modality, int(d.SeriesNumber)) for d in _results(second).values()}
    assert not {n for _, n in old_series} & {n for _, n in new_series}, (old_series, new_series)
    for dataset in _results(second).values():
        assert "v2 (current; replaces v1)" in dataset.SeriesDescription
    # the PACS now holds both result sets, the new SR referencing the old
    assert wait_until(
        lambda: len(orthanc.get(f"/studies/{study_id}/series")) == 1 + 2 * 3, WAIT_S, step=0.5
    )

    first_bundle, second_bundle = (r.json() for r in fhir.received)
    old_report, new_report = _diagnostic_report(first_bundle), _diagnostic_report(second_bundle)
    assert old_report["resource"]["status"] == "final"
    assert new_report["resource"]["status"] == "amended"
    assert new_report["resource"]["identifier"] == old_report["resource"]["identifier"]
    identifier = new_report["resource"]["identifier"][0]
    assert new_report["request"]["method"] == "PUT"
    assert new_report["request"]["url"].startswith("DiagnosticReport?identifier=")
    assert identifier["value"].split(":")[-1] in new_report["request"]["url"]
    assert "replaces version 1" in new_report["resource"]["conclusion"]

    verifier = shutil.which("dciodvfy")
    if verifier is not None:
        for path in (old_path, new_path):
            out = subprocess.run([verifier, str(path)], capture_output=True, text=True)
            errors = [line for line in (out.stdout + out.stderr).splitlines() if "Error" in line]
            assert errors == [], errors
