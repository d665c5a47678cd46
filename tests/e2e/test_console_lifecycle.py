"""Issue 16: the model lifecycle on the console's operations page, in Debian's chromium
against a real ``radserve serve``: each installed version with its deployment (stable,
canary with its share, shadow), gate, comparison record and drift state; promote and
rollback for admin sessions only, after a confirmation that asks for the audited reason,
and deploy (a version as canary with its share and URGENT choice) through a form;
a read session sees no such buttons and its forged promote is refused (403), as is an
admin's without the CSRF token."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.console import Page, browser, lesion_bundle_zip, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.dicom_series import make_ct_series, new_uid
from tests.factories.server_process import create_key_cli, radserve_command, start_server
from tests.factories.service import (
    GRID,
    ORIGIN,
    auth,
    config_file,
    lesion_hu,
    upload,
    wait_job,
)
from tests.factories.waits import wait_until

from radserve.domain.deployment import bucket

pytestmark = pytest.mark.slow

STEP = "lesions-test"


def _deployment(c: httpx.Client, token: str) -> dict[str, Any]:
    rows = c.get("/v1/models", headers=auth(token)).json()["deployments"]
    return next(d for d in rows if d["step"] == STEP)


def _audit(config: Path, data: Path, out: Path) -> list[dict[str, Any]]:
    subprocess.run(
        radserve_command(
            "audit", "export", "--out", str(out), "--config", str(config), "--data-dir", str(data)
        ),
        check=True,
        capture_output=True,
        timeout=60,
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_ops_page_shows_the_lifecycle_and_only_admin_may_promote_or_roll_back(
    tmp_path: Path,
) -> None:
    need_browser()
    config = config_file(tmp_path)
    data, port = tmp_path / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("read", "admin")}
    admin = auth(keys["admin"])
    process = start_server(config, data, port, tmp_path / "server.log")
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=120) as c:
            models = tmp_path / "assets" / "models"
            for version in ("1.1.0", "1.2.0"):
                zipped = lesion_bundle_zip(models, version, tmp_path / "bundles")
                r = c.post("/v1/models", content=zipped, headers=admin)
                assert r.status_code == 201, r.text
            for version, role, percent in (("1.1.0", "canary", 25), ("1.2.0", "shadow", 100)):
                r = c.post(
                    f"/v1/models/{STEP}/deploy",
                    json={"version": version, "role": role, "percent": percent, "reason": "try"},
                    headers=admin,
                )
                assert r.status_code == 200, r.text
            deployer = r.json()["actor"]
            # a study the canary (25 %) does not take: the stable runs it, the shadow
            # 1.2.0 is compared with it (a canary-routed study is compared with the stable)
            uid = new_uid()
            while bucket(uid, STEP) < 25:
                uid = new_uid()
            files = make_ct_series(
                tmp_path / "s", **GRID, origin=ORIGIN, hu=lesion_hu(), study_uid=uid
            )
            job = c.post("/v1/studies", files=upload(files), headers=admin)
            assert wait_job(c, job.json()["id"], keys["admin"])["state"] == "succeeded"
            # the shadow's comparison run (lowest priority, after the job) is recorded
            assert wait_until(
                lambda: any(
                    r["version"] == "1.2.0" and r["comparisons"] >= 1
                    for r in c.get("/v1/models/comparisons", headers=admin).json()
                ),
                timeout=120,
            ), "no shadow comparison recorded"

            with browser() as b:
                # --- a read session: the state, no buttons, a forged promote refused
                p = Page(b, base, tmp_path / "shots")
                p.sign_in(keys["read"])
                p.page.wait_for_selector("#worklist")
                p.goto("/#/ops")
                row = "#lifecycle tr[data-model='lesions-test'][data-version='{}']"
                p.page.wait_for_selector(row.format("1.1.0") + "[data-deployed=canary]")
                canary = p.page.locator(row.format("1.1.0")).inner_text()
                assert "canary 25 %" in canary and "fp32" in canary
                shadow = p.page.locator(row.format("1.2.0")).inner_text()
                assert "shadow 100 %" in shadow
                assert "1 comparison ·" in shadow and "lesion agreement 1.00" in shadow
                assert p.page.locator(row.format("1.0.0") + "[data-deployed=stable]").count() == 1
                # the serving versions' drift monitors are collecting their reference
                assert p.page.locator("#lifecycle td[data-drift=collecting]").count() >= 1
                step = p.page.locator("#lifecycle [data-step='lesions-test']").inner_text()
                assert "stable 1.0.0 · canary 1.1.0 25 % · shadow 1.2.0 100 %" in step
                assert "not rolled back by the guardrails" in step
                assert p.page.locator("#lifecycle tr[data-model='organs-test']").count() == 1
                buttons = "[data-action=promote], [data-action=rollback], [data-action=deploy]"
                assert p.page.locator(buttons).count() == 0
                forged = p.page.evaluate(
                    """async () => {
                        const s = await (await fetch('/console/api/session')).json()
                        const r = await fetch('/v1/models/lesions-test/promote', {
                            method: 'POST', body: JSON.stringify({reason: 'forged'}),
                            headers: {'X-CSRF-Token': s.csrf, 'Content-Type': 'application/json'}})
                        return r.status
                    }"""
                )
                assert forged == 403
                p.shot("ops-lifecycle-read")
                assert p.errors == []
                p.close()
                assert _deployment(c, keys["admin"])["canary"] == "1.1.0"

                # --- an admin session: confirm, promote, roll back
                p = Page(b, base, tmp_path / "shots")
                p.sign_in(keys["admin"])
                p.page.wait_for_selector("#worklist")
                p.goto("/#/ops")
                promote = "#lifecycle [data-step='lesions-test'] button[data-action=promote]"
                p.page.wait_for_selector(promote)
                no_token = p.page.evaluate(
                    """() => fetch('/v1/models/lesions-test/promote', {method: 'POST',
                        body: JSON.stringify({reason: 'x'}),
                        headers: {'Content-Type': 'application/json'}}).then(r => r.status)"""
                )
                assert no_token == 403
                p.page.click(promote)
                dialog = p.page.locator("#confirm-dialog")
                assert dialog.is_visible()
                assert "Promote lesions-test 1.1.0" in dialog.inner_text()
                p.shot("ops-lifecycle-confirm")
                p.page.click("#confirm-dialog [data-action=cancel-confirm]")
                assert not dialog.is_visible()
                # a confirmation without a reason sends nothing (the field is required)
                p.page.click(promote)
                p.page.click("#confirm-dialog [data-action=confirm]")
                assert dialog.is_visible()
                assert _deployment(c, keys["admin"])["canary"] == "1.1.0"  # nothing changed
                p.page.fill("#confirm-reason", "canary looked fine")
                p.page.click("#confirm-dialog [data-action=confirm]")
                p.page.wait_for_selector(row.format("1.1.0") + "[data-deployed=stable]")
                assert not dialog.is_visible()
                assert p.page.locator(promote).count() == 0  # no canary left to promote
                after = _deployment(c, keys["admin"])
                assert (after["stable"], after["canary"], after["action"]) == (
                    "1.1.0",
                    None,
                    "promote",
                )
                assert after["actor"] == deployer and after["reason"] == "canary looked fine"
                # roll back: no canary, so back to the stable before (1.0.0)
                p.page.click("#lifecycle [data-step='lesions-test'] button[data-action=rollback]")
                assert "return from 1.1.0" in dialog.inner_text()
                p.page.fill("#confirm-reason", "back to 1.0.0")
                p.page.click("#confirm-dialog [data-action=confirm]")
                p.page.wait_for_selector(row.format("1.0.0") + "[data-deployed=stable]")
                assert (
                    "last change: rollback"
                    in p.page.locator("#lifecycle [data-step='lesions-test']").inner_text()
                )
                # deploy from the console: 1.1.0 as the canary for 30 % with URGENT studies
                deploy = f"{row.format('1.1.0')} button[data-action=deploy]"
                assert p.page.locator(f"{row.format('1.0.0')} [data-action=deploy]").count() == 0
                p.page.click(deploy)
                form = p.page.locator("#deploy-dialog")
                assert form.is_visible() and "lesions-test 1.1.0" in form.inner_text()
                p.page.select_option("#deploy-role", "stable")  # a stable has no share
                assert not p.page.locator("#deploy-percent").is_visible()
                p.page.select_option("#deploy-role", "canary")
                p.page.fill("#deploy-percent", "30")
                p.page.check("#deploy-urgent")
                p.page.click("#deploy-dialog [data-action=confirm-deploy]")  # no reason yet
                assert form.is_visible() and _deployment(c, keys["admin"])["canary"] is None
                p.page.fill("#deploy-reason", "try 1.1.0 on a third")
                p.shot("ops-lifecycle-deploy")
                p.page.click("#deploy-dialog [data-action=confirm-deploy]")
                p.page.wait_for_selector(row.format("1.1.0") + "[data-deployed=canary]")
                assert not form.is_visible()
                step = p.page.locator("#lifecycle [data-step='lesions-test']").inner_text()
                assert "canary 1.1.0 30 % (URGENT too)" in step
                # a share the server refuses is answered in the form, nothing changed
                p.page.click(f"{row.format('1.1.0')} button[data-action=deploy]")
                p.page.fill("#deploy-percent", "0")
                p.page.fill("#deploy-reason", "nothing")
                p.page.click("#deploy-dialog [data-action=confirm-deploy]")
                assert form.is_visible()
                p.page.click("#deploy-dialog [data-action=cancel-deploy]")
                p.shot("ops-lifecycle-admin")
                assert p.errors == []
                p.close()
            final = _deployment(c, keys["admin"])
            deployed = (final["stable"], final["canary"], final["action"])
            assert deployed == ("1.0.0", "1.1.0", "deploy")
            assert (final["canary_percent"], final["canary_urgent"]) == (30, True)
            assert final["reason"] == "try 1.1.0 on a third"
    finally:
        process.terminate()
        process.wait(60)
    events = [
        (r["payload"].get("event"), r["actor_key_id"], r["payload"].get("reason"))
        for r in _audit(config, data, tmp_path / "audit.jsonl")
        if r["action"] == "model.changed" and r["payload"].get("event", "").startswith("deploy")
    ]
    assert events[-3:] == [
        ("deployment.promote", deployer, "canary looked fine"),
        ("deployment.rollback", deployer, "back to 1.0.0"),
        ("deployment.deploy", deployer, "try 1.1.0 on a third"),
    ]
    assert not any(reason == "forged" or reason == "x" for _, _, reason in events)
