"""Re-prioritising from the worklist (issue 16), in Debian's chromium against a real
``radserve serve``: a read session has no class menu and its forged
``POST /v1/jobs/{id}/priority`` is refused (403); an admin files a waiting OUTPATIENT
study as URGENT, and the worklist shows the new class and queue place live, the toast
naming it with its accession isolated (``<bdi>``: a right-to-left override in it does
not turn the rest of the message around); the change
is audited as ``job.reprioritised`` with who, the old and the new class.

A slow study (the heavy test model on a larger grid) occupies the only running slot
(``max_running: 1``, ``urgent_exclusive``) so the other studies stay waiting."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_models_slow, make_study, upload
from tests.factories.waits import wait_until

pytestmark = pytest.mark.slow
# the waiting study's accession: a right-to-left override and a stray isolate (SH: 12
# bytes of 16); the console shows it without the isolate, the override kept inside <bdi>
HOSTILE = {"SpecificCharacterSet": "ISO_IR 192", "AccessionNumber": "ACC\u202eRTL\u2067"}
SHOWN = "ACC\u202eRTL"


def test_admin_reprioritises_a_waiting_job_and_a_read_session_cannot(tmp_path: Path) -> None:
    need_browser()
    config = config_file(
        tmp_path, scheduler={"max_running": 1, "urgent_exclusive": True, "max_batch_size": 4}
    )
    # the blocker runs for tens of seconds (small batches: it is cancelled quickly at the end)
    make_models_slow(tmp_path / "assets" / "models", layers=40, channels=160)
    data, port = tmp_path / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("read", "admin")}
    admin = auth(keys["admin"])
    process = start_server(config, data, port, tmp_path / "server.log")
    base = f"http://127.0.0.1:{port}"
    jobs: list[str] = []
    try:
        with httpx.Client(base_url=base, timeout=60) as c:

            def submit(folder: Path, cls: str, extra: dict | None = None, **grid: int) -> str:
                files = upload(make_study(folder, extra=extra, **grid))
                r = c.post("/v1/studies", params={"priority": cls}, files=files, headers=admin)
                assert r.status_code == 202, r.text
                jobs.append(r.json()["id"])
                return jobs[-1]

            blocker = submit(tmp_path / "big", "urgent", n_slices=96, rows=192, cols=192)
            assert wait_until(
                lambda: c.get(f"/v1/jobs/{blocker}", headers=admin).json()["state"] == "running",
                timeout=60,
            )
            ward = submit(tmp_path / "ward", "inpatient")
            target = submit(tmp_path / "out", "outpatient", extra=HOSTILE)
            assert wait_until(
                lambda: c.get(f"/v1/jobs/{target}", headers=admin).json()["queue_position"] == 1,
                timeout=30,
            )

            with browser() as b:
                p = Page(b, base, tmp_path / "shots")
                p.sign_in(keys["read"])
                row = f"#worklist tr[data-id='{target}']"
                p.page.wait_for_selector(f"{row}[data-state=queued]")
                assert p.page.locator("select[data-action=reprioritise]").count() == 0
                forged = p.page.evaluate(
                    """async (id) => {
                        const s = await (await fetch('/console/api/session')).json()
                        const r = await fetch('/v1/jobs/' + id + '/priority', {
                            method: 'POST',
                            headers: {'X-CSRF-Token': s.csrf, 'Content-Type': 'application/json'},
                            body: JSON.stringify({priority_class: 'urgent'})})
                        return [r.status, (await r.json()).error.code]
                    }""",
                    target,
                )
                assert forged == [403, "forbidden"]
                assert p.errors == []
                p.close()

                p = Page(b, base, tmp_path / "shots")
                asked: list[str] = []
                p.page.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
                p.sign_in(keys["admin"])
                p.page.wait_for_selector("#live.on")
                p.page.wait_for_selector(
                    f"{row}[data-state=queued] select[data-action=reprioritise]"
                )
                # without the CSRF token the API refuses the admin session too
                no_token = p.page.evaluate(
                    """(id) => fetch('/v1/jobs/' + id + '/priority', {method: 'POST',
                        headers: {'Content-Type': 'application/json'},
                        body: JSON.stringify({priority_class: 'urgent'})}).then(r => r.status)""",
                    target,
                )
                assert no_token == 403
                assert p.page.locator(f"{row} .cls").inner_text() == "OUTPATIENT"
                navigations: list[str] = []
                p.page.on("framenavigated", lambda frame: navigations.append(frame.url))
                p.page.select_option(f"{row} select[data-action=reprioritise]", "URGENT")
                p.page.wait_for_selector(f"{row} .cls-URGENT", timeout=ms(10))
                # the new queue place itself is checked in the scheduler's unit tests
                # (test_scheduling_reprioritise): here the blocker may finish at any moment
                assert p.page.locator(f"#worklist tr[data-id='{ward}'] .cls").inner_text() == (
                    "INPATIENT"
                )
                assert navigations == []
                # the accession's right-to-left override stays inside its <bdi> in the
                # toast (the isolate character it also holds is dropped), and inside
                # FSI...PDI in the confirmation's plain text: ": now URGENT" reads as is
                toast = p.page.locator("#toast")
                toast.locator("bdi").wait_for(timeout=ms(10))
                assert toast.locator("bdi").evaluate_all(
                    "els => els.map(e => [e.parentElement.id, e.textContent])"
                ) == [["toast", SHOWN]]
                assert toast.text_content() == f"{SHOWN}: now URGENT"
                assert asked == [
                    f"File \u2068{SHOWN}\u2069 as URGENT? Its deadline becomes arrival + "
                    "the URGENT turnaround target."
                ]
                p.shot("worklist-reprioritised")
                assert p.errors == []
                p.close()

            job = c.get(f"/v1/jobs/{target}", headers=admin).json()
            # raised to URGENT it runs next: by now it may already have finished
            assert job["priority_class"] == "URGENT"
            assert job["state"] in ("queued", "running", "succeeded")
            trail = c.get(f"/console/api/jobs/{target}", headers=admin).json()["trail"]
            [entry] = [t for t in trail if t["action"] == "job.reprioritised"]
            payload = entry["payload"]
            payload = json.loads(payload) if isinstance(payload, str) else payload
            assert payload["old_priority_class"] == "OUTPATIENT"
            assert payload["new_priority_class"] == "URGENT"
            assert entry["actor_key_id"]  # the admin session's key
            # the new deadline counts from arrival: the URGENT TAT after it
            assert payload["new_deadline"] < payload["old_deadline"]
            # a started or finished job cannot change class (409), nor an unknown one (404)
            r = c.post(
                f"/v1/jobs/{blocker}/priority", json={"priority_class": "outpatient"}, headers=admin
            )
            assert r.status_code == 409 and r.json()["error"]["code"] == "job_not_waiting"
            r = c.post(
                f"/v1/jobs/{target}/priority", json={"priority_class": "soon"}, headers=admin
            )
            assert r.status_code == 400
            for job_id in jobs:
                c.delete(f"/v1/jobs/{job_id}", headers=admin)
    finally:
        process.terminate()
        process.wait(60)
