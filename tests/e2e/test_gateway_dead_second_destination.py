"""A site with two DICOM destinations, one of them dead: a VNA that takes the connection
and never speaks (a hung or SIGSTOPped peer: each association waits out
``gateway.acse_timeout_s``), listed first, and Orthanc. Orthanc gets every result of the
job while the VNA's rows are still being sent: each destination has a sender of its
own (one sender for both reached Orthanc only after the VNA's timeout). The study sent
by dcmtk's storescu as the PACS's AE. Skips without Orthanc or dcmtk."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.factories.dicom_net import storescu
from tests.factories.pacs import pacs_and_gateway, pacs_marks, terminal_jobs
from tests.factories.service import make_study
from tests.factories.waits import until

from radserve.store import JobState
from radserve.store.outbox import OutboxState

pytestmark = pacs_marks("storescu")


def test_a_vna_that_never_answers_does_not_delay_the_pacs(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        vna = {"ae_title": "VNA", "host": "127.0.0.1", "port": silent.getsockname()[1]}
        with pacs_and_gateway(tmp_path, peers_before=(vna,), gateway__acse_timeout_s=300) as (
            orthanc,
            service,
        ):
            files = make_study(tmp_path / "study")
            sent = storescu("127.0.0.1", service.gateway_address[1], files, calling="ORTHANC")
            assert sent.returncode == 0, sent.stderr
            [job] = terminal_jobs(service, 1)
            assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)

            def states(name: str) -> set[OutboxState]:
                return {r.state for r in service.outbox.items(destination=name)}

            until(lambda: states("ORTHANC") == {OutboxState.SENT}, "Orthanc has every result")
            assert states("VNA") == {OutboxState.SENDING}  # still waiting for an answer
            rows = service.outbox.items(destination="ORTHANC")
            assert {r.job_id for r in rows} == {job.id}
            assert len(orthanc.get("/instances")) == len(rows)  # each result once
            silent.close()  # the waiting association is reset: its sender can stop
