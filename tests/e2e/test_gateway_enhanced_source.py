"""An Enhanced CT (multi-frame) study from a real PACS (Orthanc) is refused at ingest with
a clear reason, before any model runs: DICOM SEG/SR results reference single-frame source
series only. Before the fix the whole pipeline ran and the job then failed in its
"dicom results" stage. The PACS gets the failure SR in that study, and a classic CT
study sent next runs and gets its SEG and SR back. Skips without the ``Orthanc`` binary."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.dicom_net import Orthanc
from tests.factories.dicom_series import make_enhanced_series, new_uid
from tests.factories.pacs import pacs_and_gateway, terminal_jobs
from tests.factories.service import GRID, ORIGIN, lesion_hu, make_study
from tests.factories.waits import wait_until

from radserve.service import Service
from radserve.store import JobState

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
]

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"


@pytest.fixture
def pacs_and_server(tmp_path: Path) -> Iterator[tuple[Orthanc, Service]]:
    with pacs_and_gateway(tmp_path, warm=True) as peers:
        yield peers


def _count_model_runs(service: Service) -> list[int]:
    """Counts the organ model's batches (the first model of the test pipeline)."""
    session = service.catalog.sessions.get(service.catalog.registry.get("organs-test"), "fp32")
    calls = [0]
    run = session.run

    def counted(batch: Any) -> Any:
        calls[0] += 1
        return run(batch)

    session.run = counted  # type: ignore[method-assign]
    return calls


def _classes(orthanc: Orthanc, study_id: str) -> list[str]:
    return sorted(
        orthanc.get(f"/instances/{i['ID']}/simplified-tags")["SOPClassUID"]
        for i in orthanc.get(f"/studies/{study_id}/instances")
    )


def test_enhanced_ct_is_refused_before_inference_and_the_next_study_runs(
    pacs_and_server: tuple[Orthanc, Service], tmp_path: Path
) -> None:
    orthanc, service = pacs_and_server
    runs = _count_model_runs(service)
    enhanced = make_enhanced_series(
        tmp_path / "enhanced",
        n_frames=GRID["n_slices"],
        rows=GRID["rows"],
        cols=GRID["cols"],
        spacing=GRID["spacing"],
        origin=ORIGIN,
        hu=lesion_hu(),
        study_uid=new_uid(),
    )
    enhanced_study = orthanc.upload([enhanced])
    orthanc.push("radserve", [enhanced_study])
    [refused] = terminal_jobs(service, 1)
    assert refused.state is JobState.FAILED
    assert refused.error_code == "report_failed"
    assert "multi-frame" in refused.error_message and "before inference" in refused.error_message
    assert runs[0] == 0  # refused at ingest: no model ran for it
    # the PACS is told, in that study: the failure SR (and nothing else new)
    assert wait_until(lambda: SR_3D in _classes(orthanc, enhanced_study), 60)

    classic = orthanc.upload(make_study(tmp_path / "classic"))
    orthanc.push("radserve", [classic])
    jobs = terminal_jobs(service, 2)
    assert jobs[1].state is JobState.SUCCEEDED, (jobs[1].error_code, jobs[1].error_message)
    assert runs[0] > 0
    assert wait_until(lambda: {SEG, SR_3D} <= set(_classes(orthanc, classic)), 60)
