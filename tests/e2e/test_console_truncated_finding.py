"""The console's findings table marks a lesion cut by the edge of the scan (issue 11's
loose end): its diameters and volume read '≥ …' and the row names the edge, as the
organ table does for a partial organ. Debian's chromium against a real ``radserve serve``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tests.factories.console import Page, browser, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

pytestmark = pytest.mark.slow


def test_a_lesion_cut_by_the_first_slice_shows_lower_bounds(tmp_path: Path) -> None:
    need_browser()
    config = config_file(tmp_path)
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin")
    process = start_server(config, data, port, tmp_path / "server.log")
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as c:
            # the 4 mm sphere centred 1 mm above the first slice (z = 0): cut by it
            study = make_study(tmp_path / "s", centre=(3.0, -2.0, 1.0))
            job_id = c.post("/v1/studies", files=upload(study), headers=auth(admin)).json()["id"]
            assert wait_job(c, job_id, admin)["state"] == "succeeded"
            (finding,) = c.get(f"/v1/jobs/{job_id}/report", headers=auth(admin)).json()["findings"]
            assert (finding["coverage"], finding["edges"]) == ("partial", ["first_slice"])
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            p.sign_in(admin)
            p.page.click(f"#worklist tr[data-id='{job_id}']")
            row = p.page.locator("#findings tr.finding").first
            row.wait_for()
            assert row.get_attribute("data-coverage") == "partial"
            assert "first slice" in (row.get_attribute("title") or "")
            cells = [row.locator("td").nth(i).inner_text() for i in (3, 4, 5)]
            assert all(cell.startswith("≥ ") for cell in cells), cells
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)
