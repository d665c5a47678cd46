"""The console's study view names the series of a study that were not analysed, with
the reason the report gives, above the viewer: a radiologist must see at a glance that
only part of the study was read. Found trying the console as a radiologist would (an MR
series and a 2-slice CT beside the CT that ran were on the report but nowhere on the
page). Debian's chromium against a real ``radserve serve``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pydicom
import pytest
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.dicom_series import make_ct_series, make_mr_series, new_uid
from tests.factories.dicomweb import dicom_parts, related
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.waits import until

pytestmark = pytest.mark.slow


def test_the_study_view_lists_the_series_not_analysed_and_why(tmp_path: Path) -> None:
    need_browser()
    # the test pipeline: CT, at least 3 slices
    config = config_file(tmp_path, dicomweb={"quiet_s": 1.0})
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin")
    process = start_server(config, data, port, tmp_path / "server.log")
    try:
        base = f"http://127.0.0.1:{port}"
        ct = make_study(tmp_path / "ct")
        study_uid = pydicom.dcmread(ct[0], stop_before_pixels=True).StudyInstanceUID
        short = make_ct_series(tmp_path / "short", n_slices=2, series_number=2, study_uid=study_uid)
        mr = make_mr_series(tmp_path / "mr", series_number=3, study_uid=study_uid)
        with httpx.Client(base_url=base, timeout=60) as c:
            r = c.post("/v1/studies", files=upload([*ct, *short, *mr]), headers=auth(admin))
            job_id = r.json()["id"]
            assert wait_job(c, job_id, admin)["state"] == "succeeded"
            report = c.get(f"/v1/jobs/{job_id}/report", headers=auth(admin)).json()
            # another study: only the 2-slice CT and the MR, neither of which qualifies
            uid = new_uid()
            alone = [
                *make_ct_series(tmp_path / "s2", n_slices=2, series_number=2, study_uid=uid),
                *make_mr_series(tmp_path / "m2", series_number=3, study_uid=uid),
            ]
            # the upload form refuses it at the door (422, no job); sent by STOW-RS for the
            # quiet period (as a PACS sends, acknowledged first) it gets a job, which fails
            r = c.post("/v1/studies", files=upload(alone), headers=auth(admin))
            assert r.status_code == 422 and r.json()["error"]["code"] == "study_invalid", r.text
            failed_id = _quiet_stow_job(c, alone, admin)
            failed = wait_job(c, failed_id, admin)
            assert (failed["state"], failed["error"]["code"]) == ("failed", "study_invalid")
            assert failed["error"]["message"] == r.json()["error"]["message"]
        rejected = report["series_selection"]["rejected"]
        assert sorted((s["series_number"], s["modality"]) for s in rejected) == [
            (2, "CT"),
            (3, "MR"),
        ]
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            # NiiVue's font lacks some glyphs: each one drawn warns (once "loading CT…")
            glyphs: list[str] = []
            p.page.on(
                "console",
                lambda m: glyphs.append(m.text) if "Missing font metric" in m.text else None,
            )
            p.sign_in(admin)
            p.page.click(f"#worklist tr[data-id='{job_id}']")
            rows = p.page.locator("#refused-series tbody tr")
            rows.first.wait_for()
            shown = [[td.inner_text() for td in row.locator("td").all()] for row in rows.all()]
            assert shown == [
                [str(s["series_number"]), s["modality"], str(s["instance_count"]), s["reason"]]
                for s in rejected
            ]
            assert sorted(row[2] for row in shown) == ["2", "8"]  # the short CT, the MR
            assert any("2 images, fewer than the 3 required" in row[3] for row in shown), shown
            assert "2 other series" in p.page.inner_text("#refused h2")
            # above the viewer, not below the fold
            refused_box = p.page.locator("#refused").bounding_box()
            viewer_box = p.page.locator("#viewer").bounding_box()
            assert refused_box and viewer_box and refused_box["y"] < viewer_box["y"]
            # the audit trail's details wrap inside their panel (they ran past its edge)
            p.page.wait_for_selector("#trail td.details")
            card = "#trail-card"
            overflow = p.page.eval_on_selector(card, "c => c.scrollWidth - c.clientWidth")
            assert overflow <= 0, overflow
            p.page.wait_for_selector("#viewer[data-slice]", timeout=ms(60))  # volumes loaded
            assert glyphs == []
            p.shot("refused-series")
            # a study none of whose series the pipeline takes: the job fails, with no report,
            # and its page shows the same card under the error
            p.goto("/")
            p.page.click(f"#worklist tr[data-id='{failed_id}']")
            rows = p.page.locator("#refused-series tbody tr")
            rows.first.wait_for()
            shown = [[td.inner_text() for td in row.locator("td").all()] for row in rows.all()]
            assert sorted(shown) == [
                ["2", "CT", "2", "2 images, fewer than the 3 required"],
                ["3", "MR", "8", "modality MR is not one of ['CT']"],
            ]
            assert "none of the 2 series" in p.page.inner_text("#refused h2")
            assert failed["error"]["code"] in p.page.inner_text("section.study")
            assert p.page.locator("#viewer").count() == 0
            p.shot("refused-series-failed")
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)


def _quiet_stow_job(c: httpx.Client, files: list[Path], key: str) -> str:
    """The id of the job the quiet period gives ``files`` sent over STOW-RS."""
    before = {j["id"] for j in c.get("/v1/jobs", headers=auth(key)).json()["items"]}
    body, content_type = related(dicom_parts(files))
    headers = {**auth(key), "Content-Type": content_type}
    r = c.post("/dicomweb/studies", params={"complete": "false"}, content=body, headers=headers)
    assert r.status_code == 200, r.text
    new: list[str] = []

    def started() -> bool:
        items = c.get("/v1/jobs", headers=auth(key)).json()["items"]
        new[:] = [j["id"] for j in items if j["id"] not in before]
        return bool(new)

    until(started, "the quiet period's job", 60)
    return new[0]
