"""Storage commitment through the whole service: Orthanc 1.10.1 pushes a study, radserve
runs it and sends its SEG and SR back asking for commitment; Orthanc's report, on a new
association to radserve's SCP, makes them ``sent``. With a Lua filter that drops the SEG
after answering its C-STORE success, the job's deliveries show the SR ``sent`` and the
SEG sent again with the commitment failure reason (before, both were ``sent``).
Skips without Orthanc."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories.pacs import pacs_and_gateway, pacs_marks, terminal_jobs
from tests.factories.service import make_study
from tests.factories.waits import until

from radserve.gateway.conformance import SEGMENTATION
from radserve.store import JobState
from radserve.store.outbox import OutboxItem, OutboxState, OutboxStore

pytestmark = pacs_marks()

DROP_SEG = """
function ReceivedInstanceFilter(dicom, origin, info)
  return dicom.Modality ~= 'SEG'
end
"""


def _states(rows: OutboxStore, job_id: str) -> dict[str, OutboxItem]:
    return {item.sop_class_uid: item for item in rows.items(job_id=job_id)}


@pytest.mark.parametrize("receivers", [1, 2])
def test_results_are_sent_once_orthanc_commits_them(tmp_path: Path, receivers: int) -> None:
    # with 2 receiving processes Orthanc's report reaches one of them, which hands it to
    # the outbox's process
    with pacs_and_gateway(tmp_path, storage_commitment=True, gateway__receivers=receivers) as (
        orthanc,
        service,
    ):
        assert service.gateway is not None
        assert len(service.gateway.scp.receiver_pids()) == (receivers if receivers > 1 else 0)
        study = orthanc.upload(make_study(tmp_path / "study"))
        orthanc.push("radserve", [study])
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
        rows = OutboxStore(service.store.engine)
        until(
            lambda: (r := rows.items(job_id=job.id)) and {i.state for i in r} == {OutboxState.SENT},
            "Orthanc's commitment report settles every result",
            state=rows.items,
        )
        items = rows.items(job_id=job.id)
        held = {
            orthanc.get(f"/instances/{i['ID']}/simplified-tags")["SOPInstanceUID"]
            for i in orthanc.get(f"/studies/{study}/instances")
        }
    assert all(item.commitment_uid and item.attempts == 1 for item in items)
    assert {item.sop_instance_uid for item in items} <= held


def test_a_seg_orthanc_drops_after_c_store_success_is_not_counted_delivered(
    tmp_path: Path,
) -> None:
    script = tmp_path / "drop-seg.lua"
    script.write_text(DROP_SEG)
    with pacs_and_gateway(
        tmp_path, storage_commitment=True, orthanc_options={"LuaScripts": [str(script)]}
    ) as (orthanc, service):
        study = orthanc.upload(make_study(tmp_path / "study"))
        orthanc.push("radserve", [study])
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
        rows = OutboxStore(service.store.engine)
        states = until(
            lambda: (
                (s := _states(rows, job.id))
                and s.get(SEGMENTATION)
                and s[SEGMENTATION].last_error
                and s
            ),
            "the report lists the SEG not committed",
            state=rows.items,
        )
        held = {
            orthanc.get(f"/instances/{i['ID']}/simplified-tags")["SOPClassUID"]
            for i in orthanc.get(f"/studies/{study}/instances")
        }
    seg = states.pop(SEGMENTATION)
    assert seg.state in (OutboxState.PENDING, OutboxState.SENDING, OutboxState.COMMITTING)
    assert "did not commit the instance" in (seg.last_error or "")
    assert "0x0112 (no such object instance)" in (seg.last_error or "")
    assert SEGMENTATION not in held
    assert states and all(item.state is OutboxState.SENT for item in states.values())
