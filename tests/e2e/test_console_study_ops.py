"""Issue 16: the console's study view (NiiVue: the CT with its label-map overlays,
clicking a finding moves to its key slice) and operations page (a delivery failing to
a stopped DICOM peer, re-armed from the page and delivered once the peer is back: dcmtk
storescp started by the test), in Debian's chromium against a real ``radserve serve``."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.dicom_net import dcmtk_tool, free_port, storescu
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.waits import wait_until

pytestmark = pytest.mark.slow


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


@pytest.fixture(scope="module")
def served_study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One server with one finished study, shown at both screen sizes (the view only
    reads it)."""
    need_browser()
    root = tmp_path_factory.mktemp("study-view")
    config = config_file(root)
    data, port = root / "data", free_port()
    admin = create_key_cli(config, data, "admin")
    process = start_server(config, data, port, root / "server.log")
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as c:
            r = c.post("/v1/studies", files=upload(make_study(root / "s")), headers=auth(admin))
            job_id = r.json()["id"]
            assert wait_job(c, job_id, admin)["state"] == "succeeded"
        yield {"base": base, "admin": admin, "job_id": job_id}
    finally:
        process.terminate()
        process.wait(60)


@pytest.mark.parametrize("size", ["laptop", "wall"])
def test_study_view_shows_the_ct_with_its_overlay_and_jumps_to_a_finding(
    served_study: dict[str, str], tmp_path: Path, size: str
) -> None:
    base, admin, job_id = served_study["base"], served_study["admin"], served_study["job_id"]
    with browser() as b:
        p = Page(b, base, tmp_path / "shots", size=size)
        p.sign_in(admin)
        p.page.wait_for_selector(f"#worklist tr[data-id='{job_id}']")
        p.page.click(f"#worklist tr[data-id='{job_id}']")
        p.page.wait_for_selector("#viewer[data-slice]", timeout=ms(60))  # volumes loaded
        p.page.wait_for_selector("#patient:has-text('Patient:')")  # admin: a PHI role
        viewer = p.page.locator("#viewer")
        on = _pixels(viewer.screenshot())
        p.shot(f"study-{size}")
        p.page.uncheck("[data-overlay=organs]")
        p.page.uncheck("[data-overlay=findings]")
        p.page.wait_for_timeout(300)  # one frame; nothing to wait on in WebGL
        off = _pixels(viewer.screenshot())
        # the liver block fills the middle of the field; air around it
        h, w, _ = on.shape
        centre = (slice(int(0.3 * h), int(0.7 * h)), slice(int(0.3 * w), int(0.7 * w)))
        corner = (slice(int(0.9 * h), h), slice(0, int(0.1 * w)))  # air, no crosshair
        changed = np.abs(on - off).sum(-1) > 30
        assert changed[centre].mean() > 0.5, changed[centre].mean()
        assert changed[corner].mean() < 0.02
        # the overlay is the liver's red: redder where it is shown
        redness = lambda img: (img[..., 0] - img[..., 1])[centre][changed[centre]].mean()  # noqa: E731
        assert redness(on) > redness(off) + 40
        # CT rendered under it: grey soft tissue (not black) with the overlay off
        assert off[centre].mean() > 60
        # window presets change the CT's grey levels
        p.page.click("[data-window=bone]")
        p.page.wait_for_timeout(300)
        assert np.abs(_pixels(viewer.screenshot()) - off).sum(-1)[centre].mean() > 10

        finding = p.page.locator("#findings tr.finding").first
        key_slice = int(finding.get_attribute("data-slice"))
        p.page.evaluate("window.__radserveViewer.goToSlice(0)")
        assert viewer.get_attribute("data-slice") == "0"
        finding.click()
        assert viewer.get_attribute("data-slice") == str(key_slice)
        assert key_slice != 0
        links = p.page.locator("#downloads a")
        hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
        for wanted in ("/report", "/fhir", "/volume", "kind=organs", "kind=findings"):
            assert any(h.endswith(wanted) for h in hrefs), (wanted, hrefs)
        assert p.page.locator("#trail tr:has-text('phi.read')").count() >= 1  # the views' reads
        assert p.errors == []
        p.close()


def test_outbox_page_shows_a_failed_delivery_and_re_arm_delivers_it(tmp_path: Path) -> None:
    need_browser()
    storescp = dcmtk_tool("storescp")
    if storescp is None or dcmtk_tool("storescu") is None:
        pytest.skip("dcmtk storescp/storescu are absent (.ci/run installs dcmtk)")
    pacs_port, scp_port = free_port(), free_port()
    config = config_file(
        tmp_path,
        gateway={
            "enabled": True,
            "port": scp_port,
            "quiet_s": 0.5,
            "connect_timeout_s": 2,
            "allowed_peers": [{"ae_title": "PACS", "host": "127.0.0.1", "port": pacs_port}],
        },
    )
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin")
    process = start_server(config, data, port, tmp_path / "server.log")
    received = tmp_path / "pacs"
    received.mkdir()
    pacs: subprocess.Popen[bytes] | None = None
    try:
        sent = storescu("127.0.0.1", scp_port, make_study(tmp_path / "s"), calling="PACS")
        assert sent.returncode == 0, sent.stderr
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as c:

            def failing() -> bool:
                items = c.get("/v1/ops/outbox", headers=auth(admin)).json()["items"]
                return bool(items) and all(i["attempts"] >= 1 and i["last_error"] for i in items)

            assert wait_until(failing, timeout=120), "no failed delivery to the stopped peer"
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            p.sign_in(admin)
            p.page.wait_for_selector("#live.on")
            p.goto("/#/ops")
            p.page.wait_for_selector("#outbox-items tr.ob-error button[data-action=rearm]")
            assert "PACS" in p.page.locator("#peer-table").inner_text()
            assert p.page.locator("#lifecycle tr[data-model='organs-test']").count() == 1
            p.shot("ops-failing")
            pacs = subprocess.Popen(
                [storescp, "-aet", "PACS", "-od", str(received), str(pacs_port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            rows = p.page.locator("#outbox-items tr.ob-error")
            ids = [rows.nth(i).get_attribute("data-outbox") for i in range(rows.count())]
            for item in ids:  # each failed delivery re-armed once, from its own row
                p.page.click(f"#outbox-items tr[data-outbox='{item}'] button[data-action=rearm]")
                p.page.wait_for_selector(
                    f"#outbox-items tr[data-outbox='{item}'] button[data-action=rearm]",
                    state="detached",
                )
            p.page.wait_for_selector("#outbox-items tr[data-state=sent]", timeout=ms(60))
            assert wait_until(
                lambda: p.page.locator("#outbox-items tr.ob-error").count() == 0, timeout=30
            )
            assert list(received.iterdir()), "the peer received nothing"
            p.shot("ops-delivered")
            assert p.errors == []
            p.close()
    finally:
        if pacs is not None:
            pacs.terminate()
            pacs.wait(10)
        process.terminate()
        process.wait(60)
