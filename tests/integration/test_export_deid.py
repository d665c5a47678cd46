"""``radserve export JOB --deidentify``: no original PHI value or UID anywhere in the
output (byte search, NIfTI decompressed), the same pseudonymous UIDs across SEG, SR and
report (SR -> SEG references resolve), dciodvfy clean, and the export audited."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pydicom
import pytest
from click.testing import CliRunner
from tests.factories.service import ServerThread, auth, make_study, settings_for, wait_job

from radserve.api import create_app
from radserve.audit.deid import KEEP_UIDS
from radserve.audit.digests import file_sha256
from radserve.commands.export import command as export_cli
from radserve.service import Service
from radserve.store.audited import open_audited

PHI = {
    "PatientName": "Quaxley^Winifred",
    "PatientID": "MRN-88412907",
    "PatientBirthDate": "19410317",
    "AccessionNumber": "ACC-55129",
    "InstitutionName": "St Quillon Hospital",
    "ReferringPhysicianName": "Drummond^Phelps",
    "StudyDescription": "CT QUAXLEY CHEST",
    "StudyID": "SQ7781",
}


def _uids(ds: pydicom.Dataset) -> set[str]:
    found = set()
    for elem in [*ds.file_meta, *ds.iterall()] if hasattr(ds, "file_meta") else ds.iterall():
        # class UIDs and the implementation (software) UID identify no study
        if elem.keyword.endswith("ClassUID") or elem.keyword in KEEP_UIDS:
            continue
        if elem.VR == "UI" and elem.value:
            values = elem.value if elem.VM > 1 else [elem.value]
            found |= {str(v) for v in values if not str(v).startswith("1.2.840.10008.")}
    return found


def _stow(client: httpx.Client, files: list[Path], token: str) -> httpx.Response:
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for path in files:
        body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        body += path.read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    headers = {
        "Content-Type": f'multipart/related; type="application/dicom"; boundary={boundary}',
        **auth(token),
    }
    return client.post("/dicomweb/studies", content=body, headers=headers)


def test_deidentified_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADSERVE_CONFIG", raising=False)
    monkeypatch.delenv("RADSERVE_DATABASE_URL", raising=False)
    settings = settings_for(tmp_path)
    service = Service(settings)
    _, token = service.store.create_api_key(name="submit", role="submit")
    files = make_study(tmp_path / "study", extra=PHI)
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        stored = _stow(c, files, token)
        assert stored.status_code in (200, 202), stored.text
        link = stored.headers["link"]
        job_id = link[len("</v1/jobs/") : -len('>; rel="related"')]
        assert wait_job(c, job_id, token)["state"] == "succeeded"
    result = Path(service.store.get_job(job_id).result_path or "")

    secrets = {v for v in PHI.values()} | {PHI["PatientName"].split("^")[0], job_id}
    for path in [*files, *result.glob("*.dcm")]:
        secrets |= _uids(pydicom.dcmread(path, stop_before_pixels=True))
    out = tmp_path / "export"
    done = CliRunner().invoke(
        export_cli,
        [job_id, "--deidentify", "--out", str(out), "--data-dir", str(settings.data_dir)],
    )
    assert done.exit_code == 0, done.output
    exported = sorted(out.iterdir())
    names = {p.name for p in exported}
    assert "report.json" in names and any(n.endswith(".nii.gz") for n in names)
    assert {n for n in names if n.endswith(".dcm")} == {p.name for p in result.glob("*.dcm")}

    for path in exported:  # byte search, NIfTI decompressed too
        blobs = [path.read_bytes()]
        if path.name.endswith(".gz"):
            blobs.append(gzip.decompress(blobs[0]))
        for blob in blobs:
            for secret in secrets:
                assert secret.encode() not in blob, (path.name, secret)

    datasets = {p.name: pydicom.dcmread(p) for p in exported if p.suffix == ".dcm"}
    report = json.loads((out / "report.json").read_text())
    studies = {str(ds.StudyInstanceUID) for ds in datasets.values()}
    assert studies == {report["study"]["study_instance_uid"]}
    assert all(ds.PatientIdentityRemoved == "YES" for ds in datasets.values())
    assert all(ds.DeidentificationMethodCodeSequence[0].CodeValue == "113100"
               for ds in datasets.values())  # fmt: skip
    segs = {str(ds.SOPInstanceUID) for ds in datasets.values() if ds.Modality == "SEG"}
    sr = next(ds for ds in datasets.values() if ds.Modality == "SR")
    referenced = {
        str(item.ReferencedSOPInstanceUID)
        for elem in sr.iterall()
        if elem.keyword == "ReferencedSOPSequence"
        for item in elem.value
    }
    assert segs and segs <= referenced  # the SR's SEG references resolve to exported SEGs
    frames = {
        str(ds.FrameOfReferenceUID) for ds in datasets.values() if "FrameOfReferenceUID" in ds
    }
    assert len(frames) == 1

    if shutil.which("dciodvfy"):
        for name in datasets:
            checked = subprocess.run(["dciodvfy", str(out / name)], capture_output=True, text=True,
                                     timeout=120, check=False)  # fmt: skip
            errors = [ln for ln in checked.stderr.splitlines() if ln.startswith("Error")]
            assert errors == [], (name, errors, checked.stderr[-3000:])

    store, _ = open_audited(settings)
    try:
        record = next(r for r in store.iter_audit() if r.action == "export.deidentified")
        assert store.verify_audit().ok
    finally:
        store.close()
    assert record.subject == job_id
    assert record.payload["files"] == {p.name: file_sha256(p) for p in exported}
