"""No result loop: a real PACS (Orthanc) that holds radserve's SEG, SR and Secondary
Capture key images and pushes the whole study again gets success for every instance,
and radserve runs nothing and sends nothing again.

Orthanc runs on private loopback ports; radserve runs as the full service (gateway,
scheduler, outbox) with key images on. Skips without the ``Orthanc`` binary."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from tests.factories.dicom_net import Orthanc
from tests.factories.pacs import pacs_and_gateway
from tests.factories.service import make_study
from tests.factories.waits import wait_until

from radserve.service import Service
from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
]

SC = "1.2.840.10008.5.1.4.1.1.7"


@pytest.fixture
def pacs_and_server(tmp_path: Path) -> Iterator[tuple[Orthanc, Service]]:
    with pacs_and_gateway(tmp_path, results__secondary_capture_key_images=True) as peers:
        yield peers


def _jobs(service: Service) -> list:
    return service.store.list_jobs(limit=100).items


def _run_through(orthanc: Orthanc, service: Service, study_id: str, jobs_before: int) -> str:
    """Push a study to radserve; wait for its job and for every result to reach Orthanc."""
    orthanc.push("radserve", [study_id])
    assert wait_until(lambda: len(_jobs(service)) > jobs_before and _jobs(service)[0].terminal, 90)
    job = _jobs(service)[0]
    assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
    rows = OutboxStore(service.store.engine)

    def delivered() -> bool:
        mine = [i for i in rows.items() if i.job_id == job.id]
        return bool(mine) and all(i.state is OutboxState.SENT for i in mine)

    assert wait_until(delivered, 60), [i.state for i in rows.items()]
    return job.id


def _metric(service: Service, intake: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "radserve_own_results_ignored_total", {"intake": intake}
    )
    return value or 0.0


def test_pacs_resending_a_study_with_radserve_results_starts_nothing(
    pacs_and_server: tuple[Orthanc, Service], tmp_path: Path
) -> None:
    orthanc, service = pacs_and_server
    files = make_study(tmp_path / "study-a")
    study_a = orthanc.upload(files)
    first = _run_through(orthanc, service, study_a, 0)

    results = [i for i in OutboxStore(service.store.engine).items() if i.job_id == first]
    classes = {i.sop_class_uid for i in results}
    assert SC in classes and len(classes) == 3, classes  # SEG, SR and key images came back
    held = orthanc.get(f"/studies/{study_a}/instances")
    assert len(held) == len(files) + len(results)
    rows_before = len(OutboxStore(service.store.engine).items())

    # the PACS pushes the whole study again: sources (already held) and radserve's results
    answer = orthanc.push("radserve", [study_a])
    assert answer.get("FailedInstancesCount", 0) == 0, answer  # every C-STORE succeeded
    assert _metric(service, "C-STORE") == len(results)

    # another study after it: once its job exists, study A's quiet period is long over
    files_b = make_study(tmp_path / "study-b")
    second = _run_through(orthanc, service, orthanc.upload(files_b), 1)

    jobs = _jobs(service)
    assert [j.id for j in jobs] == [second, first]  # no job for the re-sent study A
    rows = OutboxStore(service.store.engine).items()
    assert len([i for i in rows if i.job_id != second]) == rows_before  # nothing re-sent
    assert len(orthanc.get(f"/studies/{study_a}/instances")) == len(held)  # no new results
    source_uids = {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID for p in files}
    incoming = service.gateway.scp.instances.incoming  # type: ignore[union-attr]
    study_uid = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
    filed = {p.stem for p in (incoming / study_uid).glob("*.dcm")}
    assert filed == source_uids  # radserve's own results were never filed as input
