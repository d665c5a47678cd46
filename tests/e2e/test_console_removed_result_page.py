"""The study view, in Debian's chromium, of a job whose study and result the retention
sweep removed (``storage.source_retention_days``, ``storage.result_retention_days``):
the page shows the job, the removal where the report was and the audit trail, and the
worklist says "result removed". Before, its data was a 500 and the page said only "cannot
show this job: internal error". A real app over HTTP, a real job and a real sweep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories.console import Page, browser, need_browser
from tests.factories.retention import sweeper
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job

pytestmark = pytest.mark.slow


def test_the_study_view_of_a_job_whose_result_was_removed(tmp_path: Path) -> None:
    need_browser()
    settings = settings_for(tmp_path)
    with live_server(settings, roles=("submit", "admin"), console=True) as srv, browser() as b:
        c, service = srv["client"], srv["service"]
        r = c.post(
            "/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(srv["submit"])
        )
        job = r.json()["id"]
        assert wait_job(c, job, srv["submit"])["state"] == "succeeded"
        p = Page(b, srv["url"], tmp_path / "shots")
        try:
            p.sign_in(srv["admin"])
            page = p.page
            page.wait_for_selector("#worklist tbody tr")
            p.goto(f"/#/job/{job}")
            page.wait_for_selector("#findings")  # shown while the result is there
            sweeper(
                settings.data_dir,
                service.store,
                days=40,
                source_retention_days=30,
                result_retention_days=30,
                on_result_removed=service.cache.put,
            ).sweep()
            page.goto(f"{srv['url']}/#/")
            page.wait_for_selector(f"#worklist tr[data-id='{job}']")
            page.reload()
            row = page.wait_for_selector(f"#worklist tr[data-id='{job}']")
            assert "result removed" in row.inner_text()
            row.click()
            page.wait_for_selector("#trail tbody tr")
            text = page.inner_text("section.page")
            assert "cannot show this job" not in text
            assert "result_removed" in text and "storage.result_retention_days" in text
            assert page.query_selector("#viewer") is None
            trail = page.inner_text("#trail")
            assert "job.succeeded" in trail
            assert not p.errors, p.errors
        finally:
            p.close()
