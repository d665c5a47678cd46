"""The worklist with more jobs than one page, in Debian's chromium against a real
``radserve serve``: the page says it shows only the newest jobs and loads the older
ones on request, and the accession search finds a job far older than the first page.

The jobs are written into the server's store before it starts (born succeeded from one
finished job's result, so the server runs none of them)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import config_file

from radserve.commands.keys import open_store
from radserve.store import JobState

pytestmark = pytest.mark.slow

JOBS = 250  # more than the first page's 200
FIRST_PAGE = 200


def _accession(i: int) -> str:
    return f"ACC{i:06d}"


def _write_jobs(config: Path, data: Path) -> None:
    store = open_store(config, data)
    try:
        fields: dict[str, Any] = {
            "priority_class": "OUTPATIENT",
            "deadline": dt.timedelta(minutes=30),
            "pipeline_name": "test-pipeline",
            "pipeline_version": "1",
            "precision": "fp32",
            "fingerprint": "0" * 64,
            "study_path": str(data / "no-study"),
        }
        start = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
        source = store.create_job(**fields, arrival=start, accession="SOURCE")
        store.transition(source.id, JobState.QUEUED)
        store.transition(source.id, JobState.RUNNING)
        store.record_result(source.id, str(data / "result"))
        for i in range(JOBS - 1):
            store.create_job(
                **fields,
                arrival=start + dt.timedelta(minutes=i + 1),
                cached_from=source.id,
                accession=_accession(i),
            )
    finally:
        store.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_browser()
    root = tmp_path_factory.mktemp("console-paging")
    config = config_file(root)
    data, port = root / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("read",)}
    _write_jobs(config, data)
    process = start_server(config, data, port, root / "server.log")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "keys": keys}
    finally:
        process.terminate()
        process.wait(60)


def test_the_page_says_it_shows_the_newest_jobs_and_loads_the_older_ones(
    server: dict[str, Any], tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with browser() as b:
        p = Page(b, server["url"], tmp_path / "shots")
        p.sign_in(server["keys"]["read"])
        rows = p.page.locator("#worklist tbody tr")
        expect(rows).to_have_count(FIRST_PAGE, timeout=ms(30))
        partial = p.page.locator("#worklist-partial")
        partial.wait_for(state="visible")
        assert f"newest {FIRST_PAGE} jobs" in partial.inner_text()
        p.shot("worklist-partial")
        p.page.click("#load-more")
        expect(rows).to_have_count(JOBS, timeout=ms(30))
        partial.wait_for(state="hidden")
        shown = rows.evaluate_all("trs => trs.map(tr => tr.dataset.id)")
        assert len(set(shown)) == JOBS
        assert rows.last.locator("td.accession").inner_text() == "SOURCE"  # the oldest
        assert p.errors == []
        p.close()


def test_search_finds_an_accession_older_than_the_first_page(
    server: dict[str, Any], tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with browser() as b:
        p = Page(b, server["url"], tmp_path / "shots")
        p.sign_in(server["keys"]["read"])
        rows = p.page.locator("#worklist tbody tr")
        p.page.locator("#worklist-partial").wait_for(state="visible")
        p.page.fill("#f-accession", _accession(3).lower())
        expect(rows).to_have_count(1, timeout=ms(30))
        found = p.page.locator("#worklist tbody tr td.accession").inner_text()
        assert found == _accession(3)
        assert p.page.locator("#worklist-partial").is_hidden()
        p.shot("worklist-search-old")
        assert p.errors == []
        p.close()
