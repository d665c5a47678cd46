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
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.pacs import pacs_and_gateway, pacs_marks, terminal_jobs
from tests.factories.service import make_study
from tests.factories.waits import wait_until

from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = pacs_marks("movescu")


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
