"""One study whose series arrive at once from two allowed AEs (a modality sends the
thin reconstruction, the PACS a thick one, each with dcmtk's storescu): one job over both
series, naming both senders, the preferred series analysed and the other named with its
reason, and the results sent to each configured destination (two pynetdicom PACSs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pydicom
import pytest
from tests.factories.awkward_peer import scripted_peer
from tests.factories.dicom_net import dcmtk_tool, free_port
from tests.factories.dicom_series import make_ct_series
from tests.factories.service import make_study, settings_for
from tests.factories.waits import until

from radserve.report.json_report import read_report
from radserve.service import Service
from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]


def _storescu(port: int, files: list[Path], calling: str) -> subprocess.Popen[str]:
    tool = dcmtk_tool("storescu")
    assert tool is not None
    command = [tool, "-R", "-aet", calling, "-aec", "RADSERVE", "127.0.0.1", str(port)]
    return subprocess.Popen(
        [*command, *map(str, files)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_study_from_two_senders_is_one_job_whose_results_reach_each_destination(
    tmp_path: Path,
) -> None:
    thin = make_study(tmp_path / "thin")
    header = pydicom.dcmread(thin[0], stop_before_pixels=True)
    thick = make_ct_series(
        tmp_path / "thick",
        n_slices=4,
        rows=40,
        cols=40,
        spacing=(6.0, 1.0, 1.0),
        origin=(-19.5, -19.5, 0.0),
        study_uid=header.StudyInstanceUID,
        series_number=2,
        series_description="thick",
        extra={"PatientID": header.PatientID},
    )
    with scripted_peer() as modality_side, scripted_peer() as pacs_side:
        peers = [
            {"ae_title": "MODALITY", "host": "127.0.0.1", "port": modality_side.destination.port},
            {"ae_title": "PACS", "host": "127.0.0.1", "port": pacs_side.destination.port},
        ]
        gateway_port = free_port()
        settings = settings_for(
            tmp_path,
            gateway__enabled=True,
            gateway__port=gateway_port,
            gateway__allowed_peers=peers,
        )
        service = Service(settings, gateway_options={"quiet_s": 1.0})
        service.start()
        try:
            senders = [
                _storescu(gateway_port, thin, "MODALITY"),
                _storescu(gateway_port, thick, "PACS"),
            ]
            for sender in senders:
                _, err = sender.communicate(timeout=60)
                assert sender.returncode == 0, err
            job = until(
                lambda: next(
                    (j for j in service.store.list_jobs(limit=5).items if j.terminal), None
                ),
                "the study's job to finish",
                timeout=120,
            )
            rows = OutboxStore(service.store.engine)
            until(
                lambda: (r := rows.items()) and {i.state for i in r} == {OutboxState.SENT},
                "the results delivered to both destinations",
                state=rows.items,
            )
            items, jobs = rows.items(), service.store.list_jobs(limit=5).items
        finally:
            service.stop()
    assert len(jobs) == 1 and job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
    assert job.client_address == "MODALITY,PACS"
    report = read_report(Path(str(job.result_path)) / "report.json")
    assert report.series_selection.selected.series_instance_uid == header.SeriesInstanceUID
    [other] = report.series_selection.rejected
    assert other.series_number == 2 and other.reason and other.instance_count == len(thick)
    by_destination: dict[str, set[str]] = {}
    for item in items:
        by_destination.setdefault(item.destination, set()).add(item.sop_instance_uid)
    assert set(by_destination) == {"MODALITY", "PACS"}
    assert by_destination["MODALITY"] == by_destination["PACS"]
    for peer in (modality_side, pacs_side):
        assert {d.SOPInstanceUID for d in peer.received} == by_destination["PACS"]
