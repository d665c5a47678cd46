"""A PACS that accepts only Implicit VR Little Endian (Orthanc 1.10.1 with
``AcceptedTransferSyntaxes`` limited to it) gets radserve's SEG, SR and key-image
Secondary Captures re-encoded to it, and what it holds reads back right through its own
REST API: every frame of the SEG, the SR's findings, each object dciodvfy-clean, and
every instance they reference held by the PACS itself. Skips without Orthanc."""

from __future__ import annotations

from pathlib import Path

import pydicom
from pydicom.uid import ImplicitVRLittleEndian
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.pacs import pacs_and_gateway, pacs_marks, terminal_jobs
from tests.factories.service import make_study
from tests.factories.waits import until

from radserve.gateway.conformance import COMPREHENSIVE_3D_SR, SEGMENTATION
from radserve.report.json_report import read_report
from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = pacs_marks()
IMPLICIT_ONLY = {"AcceptedTransferSyntaxes": [ImplicitVRLittleEndian]}


def _referenced(dataset: pydicom.Dataset) -> set[str]:
    """Every SOP Instance UID a result references, at any depth."""
    found: set[str] = set()

    def visit(ds: pydicom.Dataset, _element: object) -> None:
        if getattr(_element, "keyword", "") == "ReferencedSOPInstanceUID":
            found.add(str(_element.value))  # type: ignore[attr-defined]

    dataset.walk(visit)
    return found


def test_an_implicit_vr_only_pacs_holds_results_that_read_back_whole(tmp_path: Path) -> None:
    with pacs_and_gateway(
        tmp_path, orthanc_options=IMPLICIT_ONLY, results__secondary_capture_key_images=True
    ) as (orthanc, service):
        files = make_study(tmp_path / "study")
        study = orthanc.upload(files)
        orthanc.push("radserve", [study])
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
        rows = OutboxStore(service.store.engine)
        until(
            lambda: (r := rows.items()) and {i.state for i in r} == {OutboxState.SENT},
            "every result stored by the implicit-only PACS",
            state=rows.items,
        )
        results = {i.sop_instance_uid: i for i in rows.items()}
        held = {
            orthanc.get(f"/instances/{i['ID']}/simplified-tags")["SOPInstanceUID"]: i["ID"]
            for i in orthanc.get(f"/studies/{study}/instances")
        }
        assert set(results) <= set(held) and len(held) == len(files) + len(results)
        report = read_report(Path(str(job.result_path)) / "report.json")
        for uid, item in results.items():
            orthanc_id = held[uid]
            path = tmp_path / "held" / f"{uid}.dcm"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(orthanc.file(orthanc_id))
            assert dciodvfy_errors(path) == [], uid
            dataset = pydicom.dcmread(path)
            assert dataset.file_meta.TransferSyntaxUID == ImplicitVRLittleEndian, uid
            written = pydicom.dcmread(item.path)
            assert dataset.get("PixelData") == written.get("PixelData"), uid  # OB came as OW
            assert _referenced(dataset) and _referenced(dataset) <= set(held), uid
            tags = orthanc.get(f"/instances/{orthanc_id}/simplified-tags")
            if item.sop_class_uid == SEGMENTATION:
                frames = orthanc.get(f"/instances/{orthanc_id}/frames")
                assert len(frames) == int(tags["NumberOfFrames"]) == dataset.NumberOfFrames > 0
                assert len(tags["SegmentSequence"]) == len(dataset.SegmentSequence)
            if item.sop_class_uid == COMPREHENSIVE_3D_SR:
                text = str(tags["ContentSequence"])
                assert tags["CompletionFlag"] == "COMPLETE"
                assert report.findings  # the study has a lesion
                for finding in report.findings:
                    assert finding.concept.meaning in text, finding.concept.meaning
