"""A job that cannot move says why in the worklist, in Debian's chromium against the real
app with the console installed: a newer radserve migrates the database beneath the
running server (a rolling upgrade that did not stop it first), so it hands out no new
work and its queued job has ``waiting_for: schema_not_current`` and no ETA.

The worklist showed only the state (``queued``) and an empty ETA cell: an imaging-IT
engineer could not tell a job stuck behind a block from one about to start. Now the ETA
cell says what the job waits for, the server's message in its tooltip, and changes
live (the block changes no job record, so the event stream says it: ``waiting``).

The job is kept waiting first by a hold of the test's own (as
``tests/integration/test_schema_changed_running.py`` does); the server is not asked to
stop (``radserve serve`` would exit 2 on the changed schema) so the page can be read.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.service import ServerThread, auth, make_study, settings_for, upload
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.service import Service
from radserve.store.migrate import head_revision

pytestmark = pytest.mark.slow

NEWER = "9999_from_a_newer_radserve"


def _stamp(service: Service, revision: str) -> None:
    with service.store.engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": revision})


def test_a_queued_job_says_what_it_waits_for_and_the_page_follows_the_block_live(
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    need_browser()
    # the lease renewed, and the schema revision read, every second
    service = Service(settings_for(tmp_path, jobs__lease_s=3.0))
    app = create_app(service)
    install_console(app, service)
    _, submit = service.store.create_api_key(name="ris", role="submit")
    _, reader = service.store.create_api_key(name="imaging-it", role="read")
    try:
        with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            assert service.wait_warm(120 * WAIT_SCALE)
            service.scheduler.hold("test_hold", "held by the test: the study stays queued")
            r = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "a")), headers=auth(submit)
            )
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            with browser() as b:
                p = Page(b, srv.url, tmp_path / "shots")
                p.sign_in(reader)
                row = p.page.locator(f"#worklist tr[data-id='{job_id}']")
                cell = row.locator("td.eta")
                # a block the console has no words for: its code, in words
                expect(cell).to_have_text("waiting: test hold", timeout=ms(30))
                assert cell.get_attribute("data-waiting") == "test_hold"
                reads: list[str] = []
                p.page.on(
                    "request",
                    lambda req: (
                        reads.append(req.url) if "/console/api/worklist" in req.url else None
                    ),
                )

                _stamp(service, NEWER)  # the newer radserve's migration
                try:
                    until(
                        lambda: (
                            (
                                c.get(f"/v1/jobs/{job_id}", headers=auth(reader)).json()[
                                    "waiting_for"
                                ]
                                or {}
                            ).get("reason")
                            == "schema_not_current"
                        ),
                        "the job to wait for the schema",
                        60,
                        step=0.2,
                    )
                    # live: no job record changed, and the list was not read again
                    expect(cell).to_have_text(
                        "waiting: database upgraded by a newer radserve", timeout=ms(30)
                    )
                    assert reads == []
                    assert cell.get_attribute("data-waiting") == "schema_not_current"
                    title = cell.get_attribute("title") or ""
                    assert NEWER in title and "since" in title, title
                    assert row.locator("td.state").inner_text() == "queued"
                    p.shot("worklist-waiting")
                    # the list read says the same after a reload
                    p.page.reload()
                    expect(cell).to_have_text(
                        "waiting: database upgraded by a newer radserve", timeout=ms(30)
                    )
                    assert p.errors == []
                    p.close()
                finally:
                    _stamp(service, head_revision())
    finally:
        service.stop()
