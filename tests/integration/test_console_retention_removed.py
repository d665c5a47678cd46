"""The console for a job whose study (``storage.source_retention_days``) and then whose
result (``storage.result_retention_days``) the retention sweep removed, against the real
app over HTTP with a signed-in admin session, real jobs and a real sweep.

Before: the study view's data (``GET /console/api/jobs/{id}``) was a 500 once the result
folder was gone (the report still in memory, the folder listed) and the page showed
nothing, not even the audit trail; the viewer's volume (``GET /v1/jobs/{id}/volume``)
was a 500 once the study was gone; the patient line read the missing study as a study
without a patient ("Patient: —"); a result file was a 404. Now: 410 ``source_removed`` /
``result_removed`` as the API answers them, and the study view shows the job, the
removal and the trail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.retention import sweeper
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with live_server(settings_for(tmp_path), roles=("submit", "admin"), console=True) as srv:
        yield srv


def _gone(r: httpx.Response, code: str) -> None:
    assert r.status_code == 410, r.text
    assert r.json()["error"]["code"] == code


def test_the_study_view_of_a_job_whose_source_then_result_were_removed(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, service = server["client"], server["service"]
    r = c.post(
        "/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(server["submit"])
    )
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert wait_job(c, job, server["submit"])["state"] == "succeeded"
    with httpx.Client(base_url=server["url"], timeout=60) as browser:
        assert (
            browser.post("/console/api/session", json={"key": server["admin"]}).status_code == 200
        )
        # read once while everything is there: the report is in memory from now on
        before = browser.get(f"/console/api/jobs/{job}")
        assert before.status_code == 200, before.text
        assert before.json()["report"] is not None
        assert browser.get(f"/v1/jobs/{job}/volume").status_code == 200
        data_dir = service.settings.data_dir

        # 1. the study's source images go (the result stays)
        swept = sweeper(data_dir, service.store, days=40, source_retention_days=30).sweep()
        assert swept.removed["sources"].folders == 1
        _gone(browser.get(f"/v1/jobs/{job}/volume"), "source_removed")  # was a 500
        _gone(browser.get(f"/console/api/jobs/{job}/patient"), "source_removed")  # was "—"
        still = browser.get(f"/console/api/jobs/{job}")
        assert still.status_code == 200, still.text
        assert still.json()["report"] is not None  # the result is still there

        # 2. the result goes too
        swept = sweeper(
            data_dir,
            service.store,
            days=40,
            source_retention_days=30,
            result_retention_days=30,
            on_result_removed=service.cache.put,
        ).sweep()
        assert swept.removed["results"].folders == 1
        r = browser.get(f"/console/api/jobs/{job}")
        assert r.status_code == 200, r.text  # was a 500
        detail = r.json()
        assert detail["report"] is None
        assert detail["files"] == []
        assert detail["job"]["state"] == "succeeded"
        assert detail["job"]["stage"] == "result removed"
        error = detail["job"]["error"]  # what the page shows where the report would be
        assert error["code"] == "result_removed"
        assert "storage.result_retention_days" in error["message"]
        actions = [row["action"] for row in detail["trail"]]
        assert actions[:3] == ["job.submitted", "job.started", "job.succeeded"], actions
        _gone(browser.get(f"/v1/jobs/{job}/volume"), "result_removed")
        _gone(browser.get(f"/console/api/jobs/{job}/files/report.json"), "result_removed")
        _gone(browser.get(f"/console/api/jobs/{job}/files/organs.nii.gz"), "result_removed")
        rows = browser.get("/console/api/worklist").json()["items"]
        assert [row["stage"] for row in rows if row["id"] == job] == ["result removed"]
