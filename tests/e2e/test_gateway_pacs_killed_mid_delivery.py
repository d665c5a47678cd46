"""The PACS is killed in the middle of taking radserve's results back (Orthanc, slowed to
one second per received instance by a Lua filter, SIGKILLed once it holds the first
result): the instances it answered stay delivered, the rest are retried, and once it is
started again (same database) it holds every result exactly once, dciodvfy-clean.
Skips without Orthanc."""

from __future__ import annotations

from pathlib import Path

from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.pacs import pacs_and_gateway, pacs_marks, terminal_jobs
from tests.factories.service import make_study
from tests.factories.waits import until

from radserve.store import JobState
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = pacs_marks()

SLOW_RECEIVER = """
function ReceivedInstanceFilter(dicom, origin, info)
  if origin["RequestOrigin"] == "DicomProtocol" then
    os.execute("sleep 1")
  end
  return true
end
"""


def test_a_pacs_killed_mid_delivery_gets_every_result_once_after_its_restart(
    tmp_path: Path,
) -> None:
    lua = tmp_path / "slow.lua"
    lua.write_text(SLOW_RECEIVER)
    backoff = {"gateway__retry_first_s": 0.5, "gateway__retry_max_s": 1.0}
    with pacs_and_gateway(
        tmp_path,
        orthanc_options={"LuaScripts": [str(lua)]},
        results__secondary_capture_key_images=True,
        **backoff,
    ) as (orthanc, service):
        files = make_study(tmp_path / "study")
        study = orthanc.upload(files)  # over REST: not slowed
        orthanc.push("radserve", [study])
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
        until(lambda: len(orthanc.get("/instances")) > len(files), "the first result stored")
        orthanc._process.kill()  # type: ignore[union-attr]  # SIGKILL, mid-association
        orthanc._process.wait(10)  # type: ignore[union-attr]
        orthanc._process = None
        rows = OutboxStore(service.store.engine)
        until(
            lambda: any(i.attempts >= 2 for i in rows.items()),
            "the undelivered results retried while the PACS is down",
            state=rows.items,
        )
        before_restart = {i.sop_instance_uid: i for i in rows.items()}
        orthanc.start()
        until(
            lambda: {i.state for i in rows.items()} == {OutboxState.SENT},
            "every result delivered after the restart",
            state=rows.items,
        )
        results = {i.sop_instance_uid: i for i in rows.items()}
        held = [
            orthanc.get(f"/instances/{i}/simplified-tags")["SOPInstanceUID"]
            for i in orthanc.get("/instances")
        ]
        assert len(results) >= 3  # SEG, SR and at least one key image
        sent_before = [u for u, i in before_restart.items() if i.state is OutboxState.SENT]
        assert 1 <= len(sent_before) < len(results)  # killed part-way
        assert sorted(u for u in held if u in results) == sorted(results)  # each once
        for item in results.values():
            [instance] = orthanc.post(
                "/tools/find",
                {"Level": "Instance", "Query": {"SOPInstanceUID": item.sop_instance_uid}},
            )
            path = tmp_path / "held" / f"{item.sop_instance_uid}.dcm"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(orthanc.file(instance))
            assert path.read_bytes()[128:132] == b"DICM"
            assert dciodvfy_errors(path) == [], item.sop_instance_uid
