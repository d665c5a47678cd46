"""The console's operations page lists the installs whose variants the server builds after
answering (``POST /v1/models?build_variants=true``): how each ended (the bundle installed
with each variant's gate decision, or refused with the server's reason), in Debian's
chromium against a real ``radserve serve``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.console import Page, browser, lesion_bundle_zip, ms, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file
from tests.factories.waits import WAIT_SCALE

pytestmark = pytest.mark.slow

# small phantoms, two held-out seeds, one calibration seed: seconds, not minutes
VARIANTS = {"seeds": "0-1", "calibration_seeds": "1000", "small": True}
BUILD = "/v1/models?build_variants=true&precisions=int8"


def ended(c: httpx.Client, token: str, location: str) -> dict[str, Any]:
    deadline = time.monotonic() + 600 * WAIT_SCALE
    while time.monotonic() < deadline:
        task = c.get(location, headers=auth(token)).json()
        if task["state"] not in ("queued", "building"):
            return task
        time.sleep(0.2)
    raise AssertionError(f"{location} never ended")


def serve(tmp_path: Path) -> tuple[str, dict[str, str], Any, Path]:
    """A ``radserve serve`` with small variant builds: its URL, a read and an admin key,
    the process, and the test models folder to make bundles from."""
    config = config_file(tmp_path, lifecycle={"variants": VARIANTS})
    data, port = tmp_path / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("read", "admin")}
    process = start_server(config, data, port, tmp_path / "server.log")
    return f"http://127.0.0.1:{port}", keys, process, tmp_path / "assets" / "models"


def test_the_ops_page_shows_each_variant_build_and_how_it_ended(tmp_path: Path) -> None:
    need_browser()
    base, keys, process, models = serve(tmp_path)
    try:
        with httpx.Client(base_url=base, timeout=120) as c:
            admin = auth(keys["admin"])
            good = c.post(
                BUILD, content=lesion_bundle_zip(models, "1.3.0", tmp_path / "b"), headers=admin
            )
            stray = c.post(
                BUILD,
                content=lesion_bundle_zip(models, "2.0.0", tmp_path / "s", name="unused-lesions"),
                headers=admin,
            )
            assert (good.status_code, stray.status_code) == (202, 202), stray.text
            installed = ended(c, keys["read"], good.headers["location"])
            refused = ended(c, keys["read"], stray.headers["location"])
            assert installed["state"] == "installed" and refused["state"] == "rejected"

            with browser() as b:
                p = Page(b, base, tmp_path / "shots")
                p.sign_in(keys["read"])
                p.page.wait_for_selector("#worklist")
                p.goto("/#/ops")
                done = f"#installs tr[data-install='{installed['id']}'][data-state=installed]"
                p.page.wait_for_selector(done)
                text = p.page.locator(done).inner_text()
                gate = installed["result"]["variants"]["int8"]
                decision = "accepted" if gate["accepted"] else "rejected"
                assert "lesions-test 1.3.0 · int8 " + decision in text
                assert "HTTP upload (" in text and "bytes)" in text  # not a temporary name
                no = f"#installs tr[data-install='{refused['id']}'][data-state=rejected]"
                assert "a pipeline that runs it, and none does" in p.page.locator(no).inner_text()
                # the version built is listed with the others, its gate per precision
                row = "#lifecycle tr[data-model='lesions-test'][data-version='1.3.0']"
                assert p.page.locator(row).count() == 1
                p.shot("ops-installs")
                assert p.errors == []
                p.close()
    finally:
        process.terminate()
        process.wait(60)


def test_an_admin_installs_a_bundle_from_the_ops_page(tmp_path: Path) -> None:
    """The ops page's install form, in chromium against a real server: a bundle installed
    before the answer (listed with the versions), one whose variants are built after it
    (the installs table follows it to its end), a file that is not a zip and a version
    installed already refused with the server's reason in the form; a read-only session
    is not offered the form."""
    need_browser()
    base, keys, process, models = serve(tmp_path)
    lesion_bundle_zip(models, "1.4.0", tmp_path / "now")
    lesion_bundle_zip(models, "1.5.0", tmp_path / "later")
    not_zip = tmp_path / "bundle.zip"
    not_zip.write_text("model.yaml and model.onnx, but not zipped")
    try:
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            p.sign_in(keys["read"])
            p.page.wait_for_selector("#worklist")
            p.goto("/#/ops")
            p.page.wait_for_selector("#lifecycle tr[data-model='lesions-test']")
            assert p.page.locator("[data-action=install]").count() == 0
            p.close()

            p = Page(b, base, tmp_path / "shots")
            p.sign_in(keys["admin"])
            p.page.wait_for_selector("#worklist")
            p.goto("/#/ops")

            def install(path: Path, *, variants: bool = False) -> None:
                p.page.click("[data-action=install]")
                p.page.set_input_files("#install-file", str(path))
                if variants:
                    p.page.check("#install-variants")
                    p.page.check("#install-precisions [data-precision=int8]")
                    p.shot("ops-install-dialog")
                p.page.click("[data-action=confirm-install]")

            install(tmp_path / "now" / "lesions-test-1.4.0.zip")
            row = "#lifecycle tr[data-model='lesions-test'][data-version='1.4.0']"
            p.page.wait_for_selector(row)
            assert not p.page.locator("#install-dialog").evaluate("d => d.open")

            install(not_zip)
            alert = p.page.locator("#install-dialog [role=alert]")
            alert.filter(has_text="install refused").wait_for()
            assert "not a zip archive" in alert.inner_text()
            p.page.click("[data-action=cancel-install]")

            install(tmp_path / "now" / "lesions-test-1.4.0.zip")
            alert.filter(has_text="installed already").wait_for()
            p.page.click("[data-action=cancel-install]")

            install(tmp_path / "later" / "lesions-test-1.5.0.zip", variants=True)
            done = "#installs tr[data-state=installed]"
            p.page.wait_for_selector(done, timeout=ms(600))
            text = p.page.locator(done).inner_text()
            assert "lesions-test 1.5.0 · int8 " in text and "HTTP upload (" in text
            p.page.wait_for_selector(
                "#lifecycle tr[data-model='lesions-test'][data-version='1.5.0']"
            )
            p.shot("ops-install-form")
            refused = [e for e in p.errors if "status of 422" in e or "status of 409" in e]
            assert len(refused) == 2 and [e for e in p.errors if e not in refused] == []
            p.close()
        with httpx.Client(base_url=base, timeout=120) as c:
            [task] = c.get("/v1/models/installs", headers=auth(keys["read"])).json()
            assert (task["precisions"], task["actor"] is not None) == (["int8"], True)
    finally:
        process.terminate()
        process.wait(60)
