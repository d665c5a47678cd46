"""The PACS hangs in the middle of taking radserve's results back (Orthanc, slowed to one
second per received instance by a Lua filter, SIGSTOPped once it holds the first result:
the association it is in gets no more answers, and each new one is taken by the kernel
and never answered), then resumes (SIGCONT). Found by the hospital-edge probe of
session 37: while the PACS hung, ``/readyz`` never reported it and the outbox status
named no error (its rows were "sending" most of the time, which did not count as
failing), and the retries came back to back (each due before its attempt's timeout had
ended).

While it hangs: readiness names the destination unreachable with the last error, taken
while a retry is under way; no retry is due before the attempt before it ended. Once
it resumes: every result is in the PACS exactly once, and the senders' threads are
back to what they were. Skips without Orthanc or dcmtk."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

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
TIMEOUT_S = 4.0  # each association with the hung PACS waits this long


def test_a_pacs_that_hangs_mid_delivery_is_reported_and_then_gets_every_result_once(
    tmp_path: Path,
) -> None:
    lua = tmp_path / "slow.lua"
    lua.write_text(SLOW_RECEIVER)
    settings = {
        "gateway__retry_first_s": 1.0,
        "gateway__retry_max_s": 2.0,
        "gateway__acse_timeout_s": TIMEOUT_S,
        "gateway__dimse_timeout_s": TIMEOUT_S,
        "gateway__network_timeout_s": TIMEOUT_S,
        "outbox__unreachable_after_s": 1.0,
    }
    with pacs_and_gateway(
        tmp_path,
        orthanc_options={"LuaScripts": [str(lua)]},
        results__secondary_capture_key_images=True,
        **settings,
    ) as (orthanc, service):
        files = make_study(tmp_path / "study")
        study = orthanc.upload(files)  # over REST: not slowed
        threads_before = threading.active_count()
        orthanc.push("radserve", [study])
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
        until(lambda: len(orthanc.get("/instances")) > len(files), "the first result stored")
        pid = orthanc._process.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)  # mid-association: the next answers never come
        try:
            rows = OutboxStore(service.store.engine)

            def retrying_now() -> dict[int, int]:
                """The undelivered rows, id -> attempt, when each is in a retry that is
                under way (claimed, with the error of the attempt before); else none."""
                undelivered = [r for r in rows.items() if r.state is not OutboxState.SENT]
                if not all(
                    r.state is OutboxState.SENDING and r.attempts >= 2 and r.last_error
                    for r in undelivered
                ):
                    return {}
                return {r.id: r.attempts for r in undelivered}

            def reported_during_a_retry() -> bool:
                before = retrying_now()
                readiness = service.readiness()
                during = bool(before) and retrying_now() == before  # the same attempts
                return during and "ORTHANC" in readiness.unreachable_peers

            until(
                reported_during_a_retry,
                "the hung PACS reported while a retry to it is under way",
                timeout=120,
                state=rows.status,
            )
            [status] = [s for s in rows.status() if s.destination == "ORTHANC"]
            assert status.retrying >= 1 and status.failing_since is not None
            assert status.last_error and "ORTHANC" in status.last_error, status
            for row in rows.items():  # every retry due after the attempt before it ended
                if row.state is OutboxState.PENDING and row.attempts:
                    assert row.next_attempt_at >= row.updated, row
        finally:
            os.kill(pid, signal.SIGCONT)
        until(
            lambda: {i.state for i in rows.items()} == {OutboxState.SENT},
            "every result delivered once the PACS resumed",
            timeout=120,
            state=rows.items,
        )
        results = {i.sop_instance_uid for i in rows.items()}
        assert len(results) >= 3  # SEG, SR and at least one key image
        held = [
            orthanc.get(f"/instances/{i}/simplified-tags")["SOPInstanceUID"]
            for i in orthanc.get("/instances")
        ]
        assert sorted(u for u in held if u in results) == sorted(results)  # each once
        assert not service.readiness().unreachable_peers
        until(
            lambda: threading.active_count() <= threads_before,
            "the senders' association threads ended",
            state=threading.enumerate,
        )
