"""After the live feed resets, the worklist still shows what the user had loaded, in
Debian's chromium against a real ``radserve serve``.

The reset here is a real one: the server restarts (an upgrade, a crash), the browser's
event stream reconnects with the number of the last change it had, which the new
server does not know, and the stream says ``reset``. The page reloaded only the first
page then: 200 of the 251 jobs the user had loaded with "Load older jobs", the older
ones gone without a word. Now the reload reads down to the last page the user had, and
a job that arrived while the server was down is at the top.

The jobs are written into the store while no server runs (born succeeded from one
finished job's result, so no server runs any of them)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server, stop_servers
from tests.factories.service import auth, config_file, make_study, upload, wait_job

from radserve.commands.keys import open_store
from radserve.store import JobState

pytestmark = pytest.mark.slow

JOBS = 250  # more than the first page's 200
FIRST_PAGE = 200
ARRIVED_WHILE_DOWN = "AFTER-RESTART"

_FIELDS: dict[str, Any] = {
    "priority_class": "OUTPATIENT",
    "deadline": dt.timedelta(minutes=30),
    "pipeline_name": "test-pipeline",
    "pipeline_version": "1",
    "precision": "fp32",
    "fingerprint": "0" * 64,
}


def _write_jobs(config: Path, data: Path) -> str:
    """``JOBS`` jobs a week old, born succeeded; the id of the one they reuse."""
    store = open_store(config, data)
    try:
        start = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
        fields = {**_FIELDS, "study_path": str(data / "no-study")}
        source = store.create_job(**fields, arrival=start, accession="SOURCE")
        store.transition(source.id, JobState.QUEUED)
        store.transition(source.id, JobState.RUNNING)
        store.record_result(source.id, str(data / "result"))
        for i in range(JOBS - 1):
            store.create_job(
                **fields,
                arrival=start + dt.timedelta(minutes=i + 1),
                cached_from=source.id,
                accession=f"ACC{i:06d}",
            )
        return source.id
    finally:
        store.close()


def _write_one(config: Path, data: Path, source: str) -> None:
    store = open_store(config, data)
    try:
        store.create_job(
            **_FIELDS,
            study_path=str(data / "no-study"),
            arrival=dt.datetime.now(dt.UTC),
            cached_from=source,
            accession=ARRIVED_WHILE_DOWN,
        )
    finally:
        store.close()


def test_after_a_reset_the_worklist_keeps_the_older_jobs_the_user_had_loaded(
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    need_browser()
    config = config_file(tmp_path)
    data, port = tmp_path / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("read", "submit")}
    source = _write_jobs(config, data)
    log = tmp_path / "server.log"
    server = start_server(config, data, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        # a study run through the first server: its changes are numbered in its feed
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post(
                "/v1/studies",
                files=upload(make_study(tmp_path / "a")),
                headers=auth(keys["submit"]),
            )
            assert r.status_code == 202, r.text
            assert wait_job(c, r.json()["id"], keys["submit"])["state"] == "succeeded"
        with browser() as b:
            p = Page(b, url, tmp_path / "shots")
            p.sign_in(keys["read"])
            rows = p.page.locator("#worklist tbody tr")
            expect(rows).to_have_count(FIRST_PAGE, timeout=ms(30))
            p.page.click("#load-more")
            expect(rows).to_have_count(JOBS + 1, timeout=ms(30))
            loaded = set(rows.evaluate_all("trs => trs.map(tr => tr.dataset.id)"))
            assert len(loaded) == JOBS + 1

            stop_servers([server])
            _write_one(config, data, source)
            server = start_server(config, data, port, log)
            # the stream reconnects, the new server knows none of its numbers: reset
            # (the newest first: the job that arrived while the server was down)
            newest = rows.first.locator("td.accession")
            expect(newest).to_have_text(ARRIVED_WHILE_DOWN, timeout=ms(60))
            shown = rows.evaluate_all("trs => trs.map(tr => tr.dataset.id)")
            assert len(shown) == JOBS + 2, len(shown)
            assert loaded <= set(shown)
            assert rows.last.locator("td.accession").inner_text() == "SOURCE"  # the oldest
            assert p.page.locator("#worklist-partial").is_hidden()
            p.shot("worklist-after-reset")
            # the browser logs each refused reconnection while no server ran
            errors = [e for e in p.errors if "ERR_CONNECTION_REFUSED" not in e]
            assert errors == [], errors
            p.close()
    finally:
        stop_servers([server])
