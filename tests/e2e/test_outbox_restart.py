"""Issue 12, item 11: a delivery cut off by ``kill -9`` mid-send goes out again as soon
as the (only) server is back, not after its 15-minute lease. The FHIR server hangs on
the first POST, so the row is ``sending`` when the real ``radserve serve`` is killed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.waits import until

from radserve.store import init_store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

WAIT_S = 120.0  # far below the 900 s lease: success here means the row was reclaimed


def _rows(data: Path) -> list:
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        return OutboxStore(store.engine).items(kind=OutboxKind.FHIR)
    finally:
        store.close()


@pytest.mark.slow
def test_a_row_left_sending_by_kill_9_is_sent_again_right_after_restart(tmp_path: Path) -> None:
    with FhirServer() as fhir:
        fhir.script(Answer(delay_s=600))  # the first POST never gets its answer in time
        config = config_file(tmp_path, fhir={"url": fhir.url, "timeout_s": 300})
        data, log, port = tmp_path / "data", tmp_path / "server.log", free_port()
        key = create_key_cli(config, data)
        server = start_server(config, data, port, log)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
                r = c.post(
                    "/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(key)
                )
                assert r.status_code == 202, r.text
                assert wait_job(c, r.json()["id"], key)["state"] == "succeeded"
            until(lambda: len(fhir.received) == 1, "the first POST", WAIT_S)
            os.kill(server.pid, signal.SIGKILL)
            server.wait(30)
        finally:
            if server.poll() is None:
                server.kill()
        [row] = _rows(data)
        assert row.state is OutboxState.SENDING and row.attempts == 1
        assert row.lease_owner is not None

        server = start_server(config, data, port, log)
        try:
            until(lambda: len(fhir.received) == 2, "the bundle to be sent again", WAIT_S)
            until(lambda: _rows(data)[0].state is OutboxState.SENT, "the row to be sent", WAIT_S)
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        finally:
            if server.poll() is None:
                server.kill()
    first, second = fhir.received
    assert first.json()["id"] == second.json()["id"]  # the same Bundle, once more
    [row] = _rows(data)
    assert row.attempts == 2 and row.lease_owner is None
    assert "sent again" in log.read_text()
