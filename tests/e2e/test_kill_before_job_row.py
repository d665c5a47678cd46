"""``kill -9`` of a real ``radserve serve`` between storing a study and writing its job
row: the folder it left in ``studies/`` is marked (``<data_dir>/unclaimed/``) and the
sweeper deletes it once no job names it.

The server is stopped at that point without a hook in the code: the database (a private
PostgreSQL server, never the machine's shared one) is shut down while the upload is on
its way, so the server stores the study and then waits for the database to write the
job row (``server.store_wait_s``); the test kills it while it waits. Before session 17
the marker was written only when that wait gave up, so the folder stayed for good.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx
from sqlalchemy import create_engine
from tests.factories.dicom_net import free_port
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.replicas import rows_of
from tests.factories.server_process import create_key_cli, start_server, stop_servers
from tests.factories.service import auth, config_file, make_study, upload
from tests.factories.waits import until

from radserve.service.unclaimed import UNCLAIMED_DIR, UnclaimedStudies
from radserve.store import init_store
from radserve.store.db import normalise_url

WAIT_S = 120.0


def _studies(data: Path) -> list[Path]:
    return sorted(p for p in (data / "studies").glob("*/*") if p.is_dir())


def test_a_study_stored_by_a_server_killed_before_its_job_row_is_swept(
    tmp_path: Path,
) -> None:
    study = make_study(tmp_path / "study")
    with PrivatePostgres() as pg:
        data = tmp_path / "data"
        config = config_file(tmp_path, database_url=pg.url, server={"store_wait_s": 300.0})
        key = create_key_cli(config, data)
        url = f"http://127.0.0.1:{free_port()}"
        server = start_server(config, data, int(url.rsplit(":", 1)[1]), tmp_path / "s.log")
        try:
            # the key is checked against the database and then remembered for a while:
            # checked now, so that the upload gets past it with the database away
            until(
                lambda: httpx.get(f"{url}/readyz", headers=auth(key), timeout=60).is_success,
                "the server to be ready",
                WAIT_S,
                step=0.5,
            )
            pg.shut_down()
            answers: list[object] = []

            def post() -> None:
                try:
                    answers.append(
                        httpx.post(
                            f"{url}/v1/studies",
                            files=upload(study),
                            headers=auth(key),
                            timeout=600,
                        ).status_code
                    )
                except httpx.HTTPError as exc:  # the server is killed under it
                    answers.append(type(exc).__name__)

            poster = threading.Thread(target=post, daemon=True)
            poster.start()
            # stored (renamed into studies/), then waiting for the job row's write
            until(lambda: _studies(data), "the study to be stored", WAIT_S)
            until(
                lambda: "does not answer" in (tmp_path / "s.log").read_text(),
                "the server to wait for the database",
                WAIT_S,
            )
            server.send_signal(signal.SIGKILL)
            assert server.wait(60) == -signal.SIGKILL
            poster.join(WAIT_S)
            assert answers and answers[0] != 202, answers
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(30)
            stop_servers([server])
        [folder] = _studies(data)
        markers = [json.loads(m.read_text()) for m in (data / UNCLAIMED_DIR).glob("*.json")]
        assert markers == [{"path": str(folder)}]

        pg.start_again()
        engine = create_engine(normalise_url(pg.url))
        try:
            assert rows_of(engine)("SELECT count(*) FROM jobs")[0][0] == 0
        finally:
            engine.dispose()
        store = init_store(pg.url)
        try:
            # what a server's sweeper does once the marker is older than its grace
            assert UnclaimedStudies(data, store, grace_s=0.0).sweep() == 1
        finally:
            store.close()
        assert not folder.exists()
        assert list((data / UNCLAIMED_DIR).glob("*.json")) == []
