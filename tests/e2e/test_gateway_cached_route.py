"""A result reused from the cache still reaches the PACS: a study uploaded over HTTP
first (its result has no SEG/SR, it goes nowhere), then pushed by a real PACS (Orthanc)
over C-STORE, gets a job answered from the cache -- no model runs again -- whose SEG and
SR land in the PACS, exactly once: the same study pushed again sends nothing new.

Orthanc runs on private loopback ports; radserve runs as the full service (gateway,
scheduler, outbox). Skips without the ``Orthanc`` binary."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pydicom
import pytest
from tests.factories.dicom_net import Orthanc, free_port
from tests.factories.service import make_study, settings_for
from tests.factories.waits import wait_until

from radserve.audit.digests import file_sha256
from radserve.service import Service
from radserve.service.intake import Origin
from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
]

SEG = "1.2.840.10008.5.1.4.1.1.66.4"


@pytest.fixture
def pacs_and_server(tmp_path: Path) -> Iterator[tuple[Orthanc, Service, int]]:
    """Orthanc, radserve (results back to Orthanc) and the port of a free gateway slot
    Orthanc also knows (``scratch``: where another radserve can listen)."""
    gateway_port, scratch_port = free_port(), free_port()
    orthanc = Orthanc(
        tmp_path / "orthanc",
        peers={
            "radserve": ["RADSERVE", "127.0.0.1", gateway_port],
            "scratch": ["RADSERVE", "127.0.0.1", scratch_port],
        },
    )
    settings = settings_for(
        tmp_path,
        gateway__enabled=True,
        gateway__port=gateway_port,
        gateway__allowed_peers=[
            {"ae_title": "ORTHANC", "host": "127.0.0.1", "port": orthanc.dicom_port}
        ],
    )
    service = Service(settings, gateway_options={"quiet_s": 0.5})
    orthanc.start()
    service.start()
    try:
        yield orthanc, service, scratch_port
    finally:
        service.stop()
        orthanc.stop()


def _as_received(orthanc: Orthanc, study: str, port: int, root: Path) -> list[Path]:
    """The study's files exactly as radserve's SCP files them when Orthanc pushes it
    (a scratch radserve with no destinations receives it): the same bytes, so the same
    study fingerprint, as the push to the server under test."""
    scratch = Service(
        settings_for(root, gateway__enabled=True, gateway__port=port),
        gateway_options={"quiet_s": 0.5},
    )
    scratch.start()
    try:
        answer = orthanc.push("scratch", [study])
        assert answer.get("FailedInstancesCount", 0) == 0, answer
        assert wait_until(lambda: len(_jobs(scratch)) == 1 and _jobs(scratch)[0].terminal, 90)
        folder = Path(_jobs(scratch)[0].study_path)
        copies = root / "received"
        copies.mkdir()
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            shutil.copyfile(path, copies / path.name)
        return sorted(copies.iterdir())
    finally:
        scratch.stop()


def _jobs(service: Service) -> list:
    return service.store.list_jobs(limit=100).items


def _batches(service: Service) -> float:
    """Model batches run so far (every model, every device)."""
    total = 0.0
    for metric in service.metrics.registry.collect():
        if metric.name == "radserve_batch_size":
            total += sum(s.value for s in metric.samples if s.name.endswith("_count"))
    return total


def _upload(service: Service, files: list[Path]) -> str:
    """The study uploaded over HTTP (the REST route: no SEG/SR, nothing sent)."""
    with ExitStack() as stack:
        streams = [stack.enter_context(open(p, "rb")) for p in files]
        submission = service.intake.submit_upload(
            streams,
            resolved=service.intake.precheck(None, None),
            priority=None,
            origin=Origin(source="api"),
        )
    job_id = submission.job.id
    assert wait_until(lambda: service.store.get_job(job_id).terminal, 90)
    job = service.store.get_job(job_id)
    assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
    return job_id


def test_cached_result_from_another_route_sends_seg_and_sr_to_the_pacs_once(
    pacs_and_server: tuple[Orthanc, Service, int], tmp_path: Path
) -> None:
    orthanc, service, scratch_port = pacs_and_server
    files = make_study(tmp_path / "study")
    study = orthanc.upload(files)
    received = _as_received(orthanc, study, scratch_port, tmp_path / "scratch")
    first = _upload(service, received)  # e.g. a script uploaded the study over HTTP
    first_dir = Path(str(service.store.get_job(first).result_path))
    assert not list(first_dir.glob("*.dcm"))  # an HTTP result: no SEG/SR made
    batches = _batches(service)
    assert batches > 0
    rows = OutboxStore(service.store.engine)
    assert rows.items() == []

    answer = orthanc.push("radserve", [study])
    assert answer.get("FailedInstancesCount", 0) == 0, answer
    assert wait_until(lambda: len(_jobs(service)) == 2, 60)
    cached = _jobs(service)[0]
    assert cached.cached_from == first and cached.state is JobState.SUCCEEDED
    assert cached.queue_meta["source"] == "dicom"

    def delivered() -> bool:
        mine = [i for i in rows.items() if i.job_id == cached.id]
        return bool(mine) and all(i.state is OutboxState.SENT for i in mine)

    assert wait_until(delivered, 60), [(i.state, i.last_error) for i in rows.items()]
    sent = rows.items()
    assert {i.job_id for i in sent} == {cached.id}
    classes = sorted(i.sop_class_uid for i in sent)
    assert SEG in classes and any(c.startswith("1.2.840.10008.5.1.4.1.1.88.") for c in classes)
    held = orthanc.get(f"/studies/{study}/instances")
    assert len(held) == len(files) + len(sent)  # SEG + SR now in the PACS's study
    assert _batches(service) == batches  # answered without running a model
    study_uid = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
    assert {i.study_instance_uid for i in sent} == {study_uid}
    # the audit chain names what was sent, by digest, in the cached job's record
    (record,) = [
        r for r in service.store.iter_audit() if r.action == "job.cached" and r.subject == cached.id
    ]
    assert record.payload["outputs"]["sha256"] == {
        Path(i.path).name: file_sha256(Path(i.path)) for i in sent
    }

    # the PACS pushes the study again (with radserve's results): nothing new at all
    answer = orthanc.push("radserve", [study])
    assert answer.get("FailedInstancesCount", 0) == 0, answer
    other = orthanc.upload(make_study(tmp_path / "other"))
    orthanc.push("radserve", [other])  # once its job exists, the re-send was handled
    assert wait_until(lambda: len(_jobs(service)) == 3 and _jobs(service)[0].terminal, 90)
    jobs = _jobs(service)
    assert [j.id for j in jobs[1:]] == [cached.id, first]
    assert len([i for i in rows.items() if i.job_id != jobs[0].id]) == len(sent)
    assert len(orthanc.get(f"/studies/{study}/instances")) == len(held)
