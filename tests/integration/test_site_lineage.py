"""Under ``security.visibility: site`` a study's result lineage is the site's own.

Result generations were counted per Study Instance UID and pipeline alone: site B's run
of a study site A had run became the next generation of A's result. B's SR named A's SR
in its Predecessor Documents Sequence, B's lesions kept A's tracking UIDs, and B's FHIR
DiagnosticReport carried A's identifier with status ``amended`` (a conditional update of
A's report on the FHIR server): B learned that A had the patient, and the RIS mixed the
two hospitals' reports. Now B's first run starts B's lineage (no predecessor, its own
tracking UIDs and DiagnosticReport identifier), and B's re-run of the study (another key
of site B) supersedes B's result, not A's.

Real app over HTTP (STOW-RS, so SEG and SR are written), real jobs, highdicom reading
the SRs back, dciodvfy checking them where installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import highdicom as hd
import httpx
import pydicom
import pytest
from tests.factories.service import ServerThread, auth, make_study, settings_for, wait_job
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.service import Service

pytestmark = pytest.mark.slow

SR_FILE = "measurements-sr.dcm"


def _stow(client: httpx.Client, files: list[Path], token: str) -> str:
    """Store ``files`` over STOW-RS; the id of the job it made."""
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for path in files:
        body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        body += path.read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    media = f'multipart/related; type="application/dicom"; boundary={boundary}'
    response = client.post(
        "/dicomweb/studies", content=body, headers={"Content-Type": media, **auth(token)}
    )
    assert response.status_code == 200, response.text
    link = response.headers["link"]
    return link[len("</v1/jobs/") : -len('>; rel="related"')]


def _ran(client: httpx.Client, job_id: str, token: str) -> dict[str, Any]:
    job = wait_job(client, job_id, token, timeout=300 * WAIT_SCALE)
    assert (job["state"], job["cached"]) == ("succeeded", False), job
    return job


def _sr(service: Service, job_id: str) -> tuple[Path, hd.sr.Comprehensive3DSR]:
    path = Path(str(service.store.get_job(job_id).result_path)) / SR_FILE
    return path, hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))


def _tracking_uids(sr: hd.sr.Comprehensive3DSR) -> dict[str, str]:
    """Tracking identifier (``Lesion 1``, an organ's name) -> tracking UID."""
    groups = sr.content.get_volumetric_roi_measurement_groups()
    return {str(g.tracking_identifier): str(g.tracking_uid) for g in groups}


def _lesions(uids: dict[str, str]) -> set[str]:
    return {uid for name, uid in uids.items() if name.startswith("Lesion")}


def _diagnostic_report(client: httpx.Client, job_id: str, token: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}/fhir", headers=auth(token))
    assert response.status_code == 200, response.text
    [report] = [
        e["resource"]
        for e in response.json()["entry"]
        if e["resource"]["resourceType"] == "DiagnosticReport"
    ]
    return report  # type: ignore[no-any-return]


def test_a_sites_run_of_another_sites_study_starts_its_own_lineage(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path, security__visibility="site"))

    def key(name: str, site: str) -> str:
        return service.store.create_api_key(name=name, role="submit", site=site)[1]

    submit_a, submit_b, submit_b2 = key("a", "A"), key("b", "B"), key("b2", "B")
    files = make_study(tmp_path / "study")
    by_z = sorted(files, key=lambda p: float(pydicom.dcmread(p).ImagePositionPatient[2]))
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        a1 = _stow(c, files, submit_a)
        _ran(c, a1, submit_a)
        # site B: first half of the same study, then the whole study from another B key
        # (A's result for those very bytes is not B's to reuse: it runs again)
        b1 = _stow(c, by_z[:7], submit_b)
        _ran(c, b1, submit_b)
        b2 = _stow(c, files, submit_b2)
        _ran(c, b2, submit_b2)

        a_path, a_sr = _sr(service, a1)
        b1_path, b1_sr = _sr(service, b1)
        b2_path, b2_sr = _sr(service, b2)
        # B's first result supersedes nothing: no trace of A's SR
        assert "PredecessorDocumentsSequence" not in a_sr
        assert "PredecessorDocumentsSequence" not in b1_sr
        # B's re-run supersedes B's own result
        [predecessor] = b2_sr.PredecessorDocumentsSequence
        [series] = predecessor.ReferencedSeriesSequence
        [instance] = series.ReferencedSOPSequence
        assert series.SeriesInstanceUID == b1_sr.SeriesInstanceUID
        assert instance.ReferencedSOPInstanceUID == b1_sr.SOPInstanceUID
        assert a_sr.SOPInstanceUID not in json.dumps(b2_sr.to_json_dict())

        # tracking UIDs: none of A's in B's results; B's lesion keeps B's UID
        a_uids, b1_uids, b2_uids = (_tracking_uids(sr) for sr in (a_sr, b1_sr, b2_sr))
        assert _lesions(a_uids) and _lesions(b1_uids)
        assert not set(a_uids.values()) & (set(b1_uids.values()) | set(b2_uids.values()))
        assert _lesions(b2_uids) == _lesions(b1_uids)

        # FHIR: B's DiagnosticReport is B's own (final), amended by B's re-run
        a_report, b1_report, b2_report = (
            _diagnostic_report(c, job, token)
            for job, token in ((a1, submit_a), (b1, submit_b), (b2, submit_b2))
        )
        assert (a_report["status"], b1_report["status"]) == ("final", "final")
        assert b1_report["identifier"] != a_report["identifier"]
        assert b2_report["status"] == "amended"
        assert b2_report["identifier"] == b1_report["identifier"]

        lineage = c.get(f"/v1/jobs/{b2}/report", headers=auth(submit_b)).json()["lineage"]
        assert (lineage["generation"], lineage["supersedes_job_id"]) == (2, b1)
        first = c.get(f"/v1/jobs/{b1}/report", headers=auth(submit_b)).json()["lineage"]
        assert (first["generation"], first["supersedes_job_id"]) == (1, None)

    verifier = shutil.which("dciodvfy")
    if verifier is not None:
        for path in (a_path, b1_path, b2_path):
            out = subprocess.run([verifier, str(path)], capture_output=True, text=True)
            errors = [line for line in (out.stdout + out.stderr).splitlines() if "Error" in line]
            assert errors == [], errors
