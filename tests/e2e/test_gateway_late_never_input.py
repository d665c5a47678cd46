"""Instances no pipeline analyses, sent after the study's hand-over (a modality's
localizer and screen capture, then its dose report, each in an association of its own
with dcmtk's storescu), start no re-run and send the PACS nothing more; a late series
that is a volume still re-runs the study. Before 2026-12-04 the late localizer and
screen capture re-ran the whole study and the PACS got a second, identical SEG, SR and
key image as 'v2 (current; replaces v1)'."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pydicom
import pytest
from tests.factories.awkward_peer import scripted_peer
from tests.factories.dicom_net import dcmtk_tool, free_port, storescu
from tests.factories.dicom_series import make_ct_series
from tests.factories.extra_series import dose_report, localizer, screen_capture
from tests.factories.service import make_study, settings_for
from tests.factories.waits import until

from radserve.gateway.completeness import HANDOVER_MARKER
from radserve.service import Service
from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]
QUIET_S = 1.0


def handed_over(service: Service, study_uid: str) -> int:
    """How many instances of the study the gateway has handed to intake, by the marker it
    writes once intake has taken them (and decided whether they start a job)."""
    assert service.gateway is not None
    folder = service.gateway.scp.instances.study_dir(study_uid)
    try:
        return int(json.loads((folder / HANDOVER_MARKER).read_text())["instances"])
    except (OSError, ValueError, KeyError):
        return 0


def late_handed_over(service: Service, study_uid: str, count: int) -> None:
    """Wait until intake has taken the late instances (``count`` in the study now), then
    a quiet period more, in which a job they started would show. Before, a fixed 5 s."""
    until(lambda: handed_over(service, study_uid) == count, f"{count} instances handed over", 30)
    time.sleep(QUIET_S)


def test_late_instances_no_pipeline_analyses_start_no_rerun(tmp_path: Path) -> None:
    ct = make_study(tmp_path / "ct")
    header = pydicom.dcmread(ct[0], stop_before_pixels=True)
    same = {"study_uid": header.StudyInstanceUID, "extra": {"PatientID": header.PatientID}}
    never_input = [
        *localizer(tmp_path / "localizer", ct[0]),
        *screen_capture(tmp_path / "sc", ct[0]),
    ]
    dose = dose_report(tmp_path / "dose", ct[0])
    thick = make_ct_series(
        tmp_path / "thick", n_slices=4, spacing=(6.0, 1.0, 1.0), series_number=4, **same
    )
    with scripted_peer() as pacs:
        port = free_port()
        peer = {"ae_title": "PACS", "host": "127.0.0.1", "port": pacs.destination.port}
        settings = settings_for(
            tmp_path, gateway__enabled=True, gateway__port=port, gateway__allowed_peers=[peer]
        )
        service = Service(settings, gateway_options={"quiet_s": QUIET_S})
        service.start()
        rows = OutboxStore(service.store.engine)

        def jobs_done(count: int) -> list:
            jobs = service.store.list_jobs(limit=10).items
            finished = len(jobs) == count and all(j.terminal for j in jobs)
            delivered = rows.items() and {i.state for i in rows.items()} == {OutboxState.SENT}
            return jobs if finished and delivered else []

        try:
            assert storescu("127.0.0.1", port, ct, calling="PACS").returncode == 0
            [first] = until(lambda: jobs_done(1), "the study's job and its results", 120)
            results = len(rows.items())
            for late in (never_input, [dose]):
                assert storescu("127.0.0.1", port, late, calling="PACS").returncode == 0
            # the dose report (an SR) is quarantined, never handed over
            late_handed_over(service, header.StudyInstanceUID, len(ct) + len(never_input))
            assert jobs_done(1) and len(rows.items()) == results
            assert len(pacs.received) == results

            assert storescu("127.0.0.1", port, thick, calling="PACS").returncode == 0
            rerun, _ = until(lambda: jobs_done(2), "a late volume series to re-run", 120)
        finally:
            service.stop()
    assert first.state is JobState.SUCCEEDED and rerun.state is JobState.SUCCEEDED
    assert len(pacs.received) == len(rows.items()) > results  # the re-run's results sent


def test_late_instances_no_pipeline_analyses_are_not_flagged_under_policy_flag(
    tmp_path: Path,
) -> None:
    """Under ``late_policy: flag`` they add no ``late_instances`` warning either (the
    result would not have covered them); a late volume series still does."""
    ct = make_study(tmp_path / "ct")
    header = pydicom.dcmread(ct[0], stop_before_pixels=True)
    same = {"study_uid": header.StudyInstanceUID, "extra": {"PatientID": header.PatientID}}
    never_input = [
        *localizer(tmp_path / "localizer", ct[0]),
        *screen_capture(tmp_path / "sc", ct[0]),
    ]
    thick = make_ct_series(
        tmp_path / "thick", n_slices=4, spacing=(6.0, 1.0, 1.0), series_number=4, **same
    )
    port = free_port()
    settings = settings_for(
        tmp_path,
        gateway__enabled=True,
        gateway__port=port,
        gateway__late_policy="flag",
        gateway__allowed_peers=[{"ae_title": "PACS", "host": "127.0.0.1"}],
    )
    service = Service(settings, gateway_options={"quiet_s": QUIET_S})
    service.start()

    def warnings() -> dict[str, str]:
        [job] = service.store.list_jobs(limit=5).items
        return {w["code"]: w["message"] for w in job.queue_meta.get("warnings", [])}

    try:
        assert storescu("127.0.0.1", port, ct, calling="PACS").returncode == 0
        until(lambda: [j for j in service.store.list_jobs(limit=5).items if j.terminal], "job")
        assert storescu("127.0.0.1", port, never_input, calling="PACS").returncode == 0
        late_handed_over(service, header.StudyInstanceUID, len(ct) + len(never_input))
        assert "late_instances" not in warnings()
        assert storescu("127.0.0.1", port, thick, calling="PACS").returncode == 0
        flagged = until(lambda: warnings().get("late_instances"), "the late CT series flagged")
    finally:
        service.stop()
    assert flagged.startswith(f"{len(thick)} instances in 1 series"), flagged
