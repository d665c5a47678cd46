"""The hospital's "send to AI": a workstation asks the PACS (Orthanc) to C-MOVE a study
to radserve's AE with dcmtk's movescu; radserve does not query or retrieve itself
(docs/conformance.md section 8). The PACS's sub-operations are C-STOREs on its own
association to radserve, the study becomes one job, and its SEG and SR land back in
the PACS in the source study. A move to an AE the PACS does not know fails at the PACS
and reaches radserve not at all. Skips without Orthanc or dcmtk's movescu."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pydicom
import pytest
from pydicom.encaps import encapsulate
from pydicom.uid import MPEG4HP41, generate_uid
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.pacs import pacs_and_gateway, pacs_marks, terminal_jobs
from tests.factories.service import make_study
from tests.factories.waits import wait_until

from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = pacs_marks("movescu")
BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"
SIEMENS_CSA = "1.3.12.2.1107.5.9.1"  # Siemens CSA Non-Image Storage (private)
VIDEO_ENDOSCOPIC = "1.2.840.10008.5.1.4.1.1.77.1.1.1"


def _movescu(port: int, destination: str, study_uid: str) -> subprocess.CompletedProcess[str]:
    """Study-root C-MOVE of one study from the workstation ``WORKSTATION``."""
    command = [str(dcmtk_tool("movescu")), "-v", "-S", "-aet", "WORKSTATION", "-aec", "ORTHANC"]
    command += ["-aem", destination, "-k", "QueryRetrieveLevel=STUDY"]
    command += ["-k", f"StudyInstanceUID={study_uid}", "127.0.0.1", str(port)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_study_moved_by_the_pacs_to_radserve_comes_back_as_seg_and_sr(tmp_path: Path) -> None:
    options = {"DicomAlwaysAllowMove": True}  # the workstation is not a configured modality
    with pacs_and_gateway(tmp_path, orthanc_options=options) as (orthanc, service):
        files = make_study(tmp_path / "study")
        study = orthanc.upload(files)
        study_uid = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
        moved = _movescu(orthanc.dicom_port, "RADSERVE", study_uid)
        assert moved.returncode == 0, moved.stderr
        assert "Received Final Move Response (Success)" in moved.stderr, moved.stderr
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
        rows = OutboxStore(service.store.engine)

        def delivered() -> bool:
            mine = [i for i in rows.items() if i.job_id == job.id]
            return bool(mine) and all(i.state is OutboxState.SENT for i in mine)

        assert wait_until(delivered, 60), [(i.state, i.last_error) for i in rows.items()]
        results = [i for i in rows.items() if i.job_id == job.id]
        held = orthanc.get(f"/studies/{study}/instances")
        assert len(held) == len(files) + len(results)
        unknown = _movescu(orthanc.dicom_port, "NOBODY", study_uid)  # not in the PACS's list
        # Orthanc 1.10.1 answers "Failed: UnableToProcess", not 0xA801 (PS3.4 C.4.2.1.5)
        assert "Received Final Move Response (Failed" in unknown.stderr, unknown.stderr
        assert len(terminal_jobs(service, 1)) == 1


def _foreign_object(source: Path, folder: Path, sop_class: str) -> Path:
    """Another vendor's non-image object of class ``sop_class`` in the study of ``source``
    (a video's in MPEG-4)."""
    dataset = pydicom.dcmread(source)
    del dataset.PixelData
    if sop_class == VIDEO_ENDOSCOPIC:  # stand-in MPEG-4 bytes: nobody can transcode them
        dataset.file_meta.TransferSyntaxUID = MPEG4HP41
        dataset.PixelData = encapsulate([bytes(range(256)) * 4])
        dataset["PixelData"].VR = "OB"
    dataset.SOPClassUID = dataset.file_meta.MediaStorageSOPClassUID = sop_class
    dataset.SOPInstanceUID = dataset.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    dataset.SeriesInstanceUID, dataset.Modality, dataset.SeriesNumber = generate_uid(), "OT", 77
    folder.mkdir(parents=True, exist_ok=True)
    dataset.save_as(folder / "other.dcm")
    return folder / "other.dcm"


@pytest.mark.parametrize(
    ("policy", "sop_class"),
    [("quarantine", SIEMENS_CSA), ("quarantine", VIDEO_ENDOSCOPIC), ("refuse", BASIC_TEXT_SR)],
)
def test_a_study_with_a_non_image_object_moves_whole_unless_refused(
    tmp_path: Path, policy: str, sop_class: str
) -> None:
    """Orthanc 1.10.1 fails a whole move (and sends nothing) when radserve rejects one of
    its presentation contexts: under ``quarantine`` (default) radserve takes in private
    and newer storage classes, and non-image objects in any transfer syntax (quarantined,
    never decoded), so a Siemens study with its CSA Non-Image object, or one with an
    MPEG-4 video, runs; under ``refuse`` nothing of such a study arrives."""
    options = {"DicomAlwaysAllowMove": True}
    settings = {"gateway__unwanted": policy}
    with pacs_and_gateway(tmp_path, orthanc_options=options, **settings) as (orthanc, service):
        files = make_study(tmp_path / "study")
        other = _foreign_object(files[0], tmp_path / "foreign", sop_class)
        orthanc.upload([*files, other])
        study_uid = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
        moved = _movescu(orthanc.dicom_port, "RADSERVE", study_uid)
        received = tmp_path / "data" / "gateway"
        if policy == "refuse":
            assert "Received Final Move Response (Failed" in moved.stderr, moved.stderr
            assert not [p for p in received.rglob("*.dcm")]
            assert not service.store.list_jobs(limit=10).items
            return
        assert "Received Final Move Response (Success)" in moved.stderr, moved.stderr
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
        other_uid = pydicom.dcmread(other, stop_before_pixels=True).SOPInstanceUID
        assert [p.stem for p in (received / "quarantine").rglob("*.dcm")] == [other_uid]
