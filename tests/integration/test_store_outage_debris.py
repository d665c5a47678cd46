"""A database outage longer than ``server.store_wait_s``, on a real PostgreSQL server
that the test stops and starts, met at every door, with the periodic loops running:

- an upload and a STOW-RS request are refused 503 with ``Retry-After`` (the sender is
  told to retry), and the study each had stored is set aside: once the database is
  back, a sweep deletes both folders (no job names them);
- a study sent with dcmtk's storescu is acknowledged (its instances were durable in the
  gateway's spool) and handed over again once the database answers: one job, which
  succeeds, and its study folder is kept;
- the loops that talk to the store (the deployment watcher polling every 0.2 s, the
  lease keeper, the audit seal, the gateway's hand-over) log the outage once each, no
  traceback, and one line each when the database answers again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from tests.factories.dicom_net import dcmtk_tool, storescu
from tests.factories.dicomweb import dicom_parts, related
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.service import Service
from radserve.service.unclaimed import UNCLAIMED_DIR
from radserve.store.db import normalise_url
from radserve.store.files import fingerprint_files, study_dir

WAIT_S = 180.0
OUTAGE_S = 6.0  # 30 polls of the deployment watcher


def _jobs(url: str) -> list[tuple[str, str, str]]:
    """(id, state, study path) of every job."""
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT id, state, study_path FROM jobs"))
            return [(r[0], r[1], r[2]) for r in rows]
    finally:
        engine.dispose()


def test_an_outage_leaves_no_debris_and_is_logged_once_per_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if dcmtk_tool("storescu") is None:
        pytest.skip("dcmtk's storescu is not installed")
    caplog.set_level(logging.INFO, logger="radserve")
    with PrivatePostgres() as pg:
        settings = settings_for(
            tmp_path,
            database_url=pg.url,
            server__store_wait_s=1.0,
            lifecycle__poll_s=0.2,
            jobs__lease_s=3.0,
            gateway__enabled=True,
            gateway__port=0,
            gateway__quiet_s=0.5,
            gateway__allowed_peers=[{"ae_title": "STORESCU", "host": "127.0.0.1"}],
        )
        service = Service(settings)
        key = create_key(service.store, "admin")
        with (
            ServerThread(create_app(service, key_ttl_s=3600)) as srv,
            httpx.Client(base_url=srv.url) as c,
        ):
            assert service.wait_warm(120 * WAIT_SCALE)
            assert service.gateway_address is not None
            host, port = service.gateway_address
            # a submission first: the key is remembered, the pool holds connections
            taken = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "a")), headers=auth(key)
            )
            assert taken.status_code == 202, taken.text
            assert wait_job(c, taken.json()["id"], key, timeout=WAIT_S)["state"] == "succeeded"
            before = {job[0] for job in _jobs(pg.url)}
            # marked before it was stored, unmarked once its job row was written
            assert list((settings.data_dir / UNCLAIMED_DIR).glob("*.json")) == []

            refused_upload = make_study(tmp_path / "upload")
            refused_stow = make_study(tmp_path / "stow")
            received = make_study(tmp_path / "cstore")
            outage_from = len(caplog.records)
            pg.shut_down()
            down_at = time.monotonic()

            answer = c.post("/v1/studies", files=upload(refused_upload), headers=auth(key))
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1"
            assert answer.json()["error"]["code"] == "store_error"
            body, content_type = related(dicom_parts(refused_stow))
            answer = c.post(
                "/dicomweb/studies",
                content=body,
                headers={**auth(key), "Content-Type": content_type},
            )
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1"
            sent = storescu(host, port, received)
            assert sent.returncode == 0, sent.stderr  # durable in the spool: acknowledged
            until(
                lambda: any("handing received studies" in r.getMessage() for r in caplog.records),
                "the gateway to meet the outage",
                WAIT_S,
            )
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            during = caplog.records[outage_from:]
            pg.start_again()

            # the received study is handed over again: one job, which succeeds
            until(lambda: len(_jobs(pg.url)) > len(before), "the received study's job", WAIT_S)
            [(job_id, _, received_path)] = [j for j in _jobs(pg.url) if j[0] not in before]
            assert wait_job(c, job_id, key, timeout=WAIT_S)["state"] == "succeeded"
            until(
                lambda: _said(caplog, "reading model deployments works again"),
                "the deployment watcher to see the database again",
                WAIT_S,
            )

            # the refused studies were set aside, and the sweep deletes them (a job names
            # the received one: kept)
            refused = [
                study_dir(settings.data_dir, fingerprint_files(s))
                for s in (refused_upload, refused_stow)
            ]
            assert all(folder.is_dir() for folder in refused)
            service.unclaimed.grace_s = 0.0
            assert service.unclaimed.sweep() == 2
            assert not any(folder.exists() for folder in refused)
            assert Path(received_path).is_dir()
            assert not list((settings.data_dir / UNCLAIMED_DIR).iterdir())

            # the sender's retry is taken
            again = c.post("/v1/studies", files=upload(refused_upload), headers=auth(key))
            assert again.status_code == 202, again.text
            assert wait_job(c, again.json()["id"], key, timeout=WAIT_S)["state"] == "succeeded"
            assert refused[0].is_dir()
        service.stop()

    # during the outage: no traceback; each loop said so once
    tracebacks = [r.getMessage() for r in during if r.exc_info and r.name.startswith("radserve")]
    assert tracebacks == [], tracebacks
    lines = Counter(
        r.getMessage().split(" failed")[0] for r in during if " failed (" in r.getMessage()
    )
    for loop in (
        "reading model deployments",
        "leases: renew",
        "handing received studies to intake",
    ):
        assert lines[loop] == 1, (loop, lines)
    assert _said(caplog, "leases: renew works again")


def _said(caplog: pytest.LogCaptureFixture, words: str) -> bool:
    return any(words in r.getMessage() for r in caplog.records)
