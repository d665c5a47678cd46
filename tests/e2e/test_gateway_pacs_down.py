"""The PACS is down when a result is ready, then comes back: the job stays succeeded,
the outbox shows its results retrying with the reason and ``/readyz`` names the PACS,
and once the PACS is up again the same results reach it, each once, with the site's
back-off (``gateway.retry_first_s``/``retry_max_s``). Orthanc on private loopback ports,
the study sent by dcmtk's storescu as the PACS's AE. Skips without Orthanc or dcmtk."""

from __future__ import annotations

from pathlib import Path

import pydicom
from tests.factories.dicom_net import storescu
from tests.factories.pacs import pacs_and_gateway, pacs_marks, terminal_jobs
from tests.factories.service import make_study
from tests.factories.waits import until

from radserve.store import JobState
from radserve.store.outbox import OutboxState

pytestmark = pacs_marks("storescu")


def test_results_wait_for_a_pacs_that_is_down_and_reach_it_once_it_is_back(
    tmp_path: Path,
) -> None:
    backoff = {"gateway__retry_first_s": 0.5, "gateway__retry_max_s": 1.0}
    with pacs_and_gateway(tmp_path, outbox__unreachable_after_s=0.5, **backoff) as peers:
        orthanc, service = peers
        orthanc.stop(grace=10)
        files = make_study(tmp_path / "study")
        sent = storescu("127.0.0.1", service.gateway_address[1], files, calling="ORTHANC")
        assert sent.returncode == 0, sent.stderr
        [job] = terminal_jobs(service, 1)
        assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)

        def retrying() -> list:
            rows = service.outbox.items(destination="ORTHANC")
            return rows if rows and min(r.attempts for r in rows) >= 2 else []

        rows = until(retrying, "results retried while the PACS is down")
        assert {r.job_id for r in rows} == {job.id}
        assert {r.state for r in rows} <= {OutboxState.PENDING, OutboxState.SENDING}
        assert all("cannot connect" in (r.last_error or "") for r in rows)
        ready = until(lambda: service.readiness().unreachable_peers, "/readyz to name the PACS")
        assert list(ready) == ["ORTHANC"]

        orthanc.start()
        until(
            lambda: all(
                r.state is OutboxState.SENT for r in service.outbox.items(destination="ORTHANC")
            ),
            "every result delivered once the PACS is back",
        )
        assert not service.readiness().unreachable_peers
        study_uid = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
        [study] = orthanc.get("/studies")
        assert orthanc.get(f"/studies/{study}")["MainDicomTags"]["StudyInstanceUID"] == study_uid
        assert len(orthanc.get("/instances")) == len(rows)  # each result once
        assert service.store.get_job(job.id).state is JobState.SUCCEEDED
