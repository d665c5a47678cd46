"""The DICOM gateway inside the service: a PACS sends a study over C-STORE, radserve
runs it as a job, and sends DICOM SEG + SR back to the PACS through the outbox."""

from __future__ import annotations

from pathlib import Path

import pydicom
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import FakePacs, free_port
from tests.factories.service import make_study, settings_for
from tests.factories.waits import wait_until

from radserve.service import Service
from radserve.store import JobState

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"


def _send(files: list[Path], port: int) -> None:
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
    assert assoc.is_established
    try:
        for path in files:
            status = assoc.send_c_store(pydicom.dcmread(path))
            assert status.Status == 0x0000
    finally:
        assoc.release()


def test_study_over_dicom_comes_back_as_seg_and_sr(tmp_path: Path) -> None:
    with FakePacs() as pacs:
        settings = settings_for(
            tmp_path,
            gateway__enabled=True,
            gateway__port=free_port(),
            gateway__allowed_peers=[{"ae_title": "PACS", "host": "127.0.0.1", "port": pacs.port}],
        )
        service = Service(settings, gateway_options={"quiet_s": 0.3})
        service.start()
        try:
            assert service.gateway_address is not None
            files = make_study(tmp_path / "study", extra={"RequestedProcedurePriority": "STAT"})
            _send(files, service.gateway_address[1])

            def finished() -> bool:
                jobs = service.store.list_jobs(limit=10).items
                return bool(jobs) and jobs[0].terminal

            assert wait_until(finished, timeout=60)
            job = service.store.list_jobs(limit=10).items[0]
            assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
            assert job.priority_class == "URGENT"
            assert job.client_address == "PACS" and job.queue_meta["source"] == "dicom"
            assert wait_until(lambda: len(pacs.classes()) >= 3, timeout=60)
            assert pacs.classes().count(SEG) == 2 and pacs.classes().count(SR_3D) == 1
            sr = next(ds for ds in pacs.received if str(ds.SOPClassUID) == SR_3D)
            assert sr.StudyInstanceUID == pydicom.dcmread(files[0]).StudyInstanceUID
        finally:
            service.stop()
