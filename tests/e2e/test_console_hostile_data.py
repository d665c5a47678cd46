"""Markup planted wherever a PACS, a model author, an admin or a key's creator controls
text, shown in every console view in Debian's chromium against a real ``radserve
serve``: nothing runs, no element is made of it, and it is shown as the text it is.

Planted: the study's Patient's Name and ID, Accession Number, Study and Series
Description, Institution and Referring Physician (an analysed CT, an MR series beside it
that the pipeline refuses, and an MR-only study that fails), the label names and code
meanings of both models (findings, organs, overlay toggles), a model's description, a
deployment's reason (operations page), an install the server refuses for its
model.yaml (the answer quotes the value), the admin key's name and the read key's site
(the top bar, the audit trail). Views: the worklist, the study view of the job that ran
and of the one that failed (error and refused series), the operations page, for an
admin session and a read session of the planted site.

"Nothing ran" is checked four ways: a global the payloads would set, a loopback
listener their URLs point at, the page's Content-Security-Policy violation reports
(inline handlers the policy blocked would still be attempts) and the DOM (no element
with an inline handler, no image, script, frame or ``javascript:`` link). A last step
injects the same markup on purpose and sees the detectors fire.
"""

from __future__ import annotations

import http.server
import io
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pydicom
import pytest
import yaml
from click.testing import CliRunner
from tests.factories.console import Page, browser, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.dicom_series import make_mr_series, new_uid
from tests.factories.dicomweb import dicom_parts, related
from tests.factories.server_process import start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.waits import until

from radserve.commands.keys import group as keys_group

pytestmark = pytest.mark.slow

GLOBAL = "window.__pwned"


def payloads(port: int) -> dict[str, str]:
    """One payload per kind of place; each holds ``ZQX`` (shown) and would set
    :data:`GLOBAL` or fetch from the listener on ``port`` if it ran."""
    hit = f"http://127.0.0.1:{port}/hit"
    return {
        "img": f"ZQX<img src=x onerror={GLOBAL}=1>",
        "svg": f"ZQX<svg onload={GLOBAL}=2>",
        "script": f"ZQX<script>{GLOBAL}=3</script>",
        "attr": f'ZQX"><img src={hit} onerror={GLOBAL}=4>',
        "href": f"javascript:{GLOBAL}=5//ZQX",
        "style": f"ZQX<style>@import '{hit}';</style><iframe src={hit}>",
        # an Accession Number is SH, at most 16 characters (longer ones are refused at
        # ingest since session 42): the attribute break and an element within them
        "accession": '"><svg onload=1>',
    }


_WATCH = """(() => {
  window.__violations = []
  document.addEventListener('securitypolicyviolation', (e) =>
    window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`))
})()"""

# elements no console view makes itself: made of planted markup if they are there
_MADE = "img, iframe, object, embed, script:not([src]), style, [onerror], [onload], " + (
    'a[href^="javascript"]'
)
_STATE = f"""() => ({{
  ran: typeof {GLOBAL} !== 'undefined',
  violations: window.__violations,
  made: [...document.querySelectorAll('{_MADE}')].map((e) => e.outerHTML.slice(0, 80)),
  text: document.body.innerText,
}})"""


@contextmanager
def listener() -> Iterator[tuple[int, list[str]]]:
    """A loopback HTTP server that records every request (none may come): its port and
    the paths asked for."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], hits
    finally:
        server.shutdown()
        server.server_close()


def _key(config: Path, data: Path, role: str, *, name: str, site: str | None = None) -> str:
    args = ["create", "--role", role, "--name", name]
    args += ["--config", str(config), "--data-dir", str(data)]
    args += ["--site", site] if site else []
    created = CliRunner().invoke(keys_group, args, catch_exceptions=False)
    assert created.exit_code == 0, created.output
    return created.stdout.strip().splitlines()[-1]


def _renamed(value: Any, old: str, new: str) -> Any:
    """``value`` with every list item ``old`` (a label named by a rule) made ``new``."""
    if isinstance(value, dict):
        return {k: _renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [new if v == old else _renamed(v, old, new) for v in value]
    return value


def _plant_in_models(models: Path, p: dict[str, str]) -> None:
    """The test models' label names, a code meaning and a description hold markup (the
    organ label renamed in every rule that names it)."""
    organs = models / "organs-test" / "1.0.0" / "model.yaml"
    spec = yaml.safe_load(organs.read_text())
    old = spec["labels"][0]["name"]
    spec = _renamed(spec, old, p["svg"])
    spec["labels"][0]["name"] = p["svg"]
    organs.write_text(yaml.safe_dump(spec, sort_keys=False))
    lesions = models / "lesions-test" / "1.0.0" / "model.yaml"
    spec = _renamed(yaml.safe_load(lesions.read_text()), old, p["svg"])
    spec["description"] = p["style"]
    spec["labels"][0]["name"] = p["img"]
    spec["labels"][0]["concept"]["meaning"] = p["attr"][:64]
    lesions.write_text(yaml.safe_dump(spec, sort_keys=False))


def _bundle(models: Path, version: str, **changes: Any) -> bytes:
    """The lesion model as ``version`` (a zip for ``POST /v1/models``), with ``changes``."""
    folder = models / "lesions-test" / "1.0.0"
    spec = yaml.safe_load((folder / "model.yaml").read_text())
    spec.update(version=version, **changes)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(f"lesions-test/{version}/model.yaml", yaml.safe_dump(spec, sort_keys=False))
        zf.write(folder / "model.onnx", f"lesions-test/{version}/model.onnx")
    return out.getvalue()


def _header(p: dict[str, str]) -> dict[str, object]:
    return {
        "SpecificCharacterSet": "ISO_IR 192",
        "PatientName": p["img"] + "^" + p["svg"],
        "PatientID": p["script"],
        "AccessionNumber": p["accession"],
        "StudyDescription": p["style"],
        "SeriesDescription": p["href"],
        "InstitutionName": p["svg"],
        "ReferringPhysicianName": p["img"],
    }


def _stow_quiet(c: httpx.Client, files: list[Path], key: str, admin: str) -> str:
    """The id of the job the quiet period gives ``files`` stored with ``key``."""
    before = {j["id"] for j in c.get("/v1/jobs", headers=auth(admin)).json()["items"]}
    body, content_type = related(dicom_parts(files))
    r = c.post(
        "/dicomweb/studies",
        params={"complete": "false"},
        content=body,
        headers={**auth(key), "Content-Type": content_type},
    )
    assert r.status_code == 200, r.text
    new: list[str] = []

    def started() -> bool:
        items = c.get("/v1/jobs", headers=auth(admin)).json()["items"]
        new[:] = [j["id"] for j in items if j["id"] not in before]
        return bool(new)

    until(started, "the quiet period's job", 60)
    return new[0]


def _inert(p: Page, hits: list[str], where: str) -> str:
    state = p.page.evaluate(_STATE)
    assert state["ran"] is False, where
    assert state["violations"] == [], (where, state["violations"])
    assert state["made"] == [], (where, state["made"])
    assert hits == [], (where, hits)
    return str(state["text"])


def test_markup_from_every_source_is_shown_inert_in_every_view(tmp_path: Path) -> None:
    need_browser()
    with listener() as (listening, hits):
        p = payloads(listening)
        config = config_file(tmp_path, dicomweb={"quiet_s": 1.0}, security={"visibility": "site"})
        _plant_in_models(tmp_path / "assets" / "models", p)
        data, port = tmp_path / "data", free_port()
        admin = _key(config, data, "admin", name=p["img"])
        site = p["svg"]
        submit = _key(config, data, "submit", name="pacs", site=site)
        read = _key(config, data, "read", name=p["attr"], site=site)
        process = start_server(config, data, port, tmp_path / "server.log")
        try:
            base = f"http://127.0.0.1:{port}"
            jobs = _plant_in_jobs(base, tmp_path, p, admin=admin, submit=submit)
            with browser() as b:
                for token, role in ((admin, "admin"), (read, "read")):
                    _views(b, base, tmp_path, hits, p, token, role, jobs)
        finally:
            process.terminate()
            process.wait(60)


def _plant_in_jobs(
    base: str, tmp_path: Path, p: dict[str, str], *, admin: str, submit: str
) -> dict[str, str]:
    """A CT that runs (an MR series beside it refused), an MR-only study that fails, a
    second model version deployed with a hostile reason, and a refused install."""
    header = _header(p)
    with httpx.Client(base_url=base, timeout=120) as c:
        ct = make_study(tmp_path / "ct", extra=header)
        study = str(pydicom.dcmread(ct[0], stop_before_pixels=True).StudyInstanceUID)
        mr = make_mr_series(tmp_path / "mr", series_number=3, study_uid=study, extra=header)
        r = c.post("/v1/studies", files=upload([*ct, *mr]), headers=auth(submit))
        assert r.status_code == 202, r.text
        ran = r.json()["id"]
        assert wait_job(c, ran, submit)["state"] == "succeeded"
        # a CT whose Modality is markup: accepted, then failed for it (the site's own job)
        bad = make_study(tmp_path / "bad", extra={**header, "Modality": p["img"][:16]})
        r = c.post("/v1/studies", files=upload(bad), headers=auth(submit))
        assert r.status_code == 202, r.text
        failed = r.json()["id"]
        assert wait_job(c, failed, submit)["state"] == "failed"
        # an MR-only study sent as a PACS sends it (STOW-RS, the quiet period): it fails,
        # its page lists the series refused. Such a job has no key, so under a visibility
        # rule only admins see it (docs/security.md)
        alone = make_mr_series(tmp_path / "mr2", study_uid=new_uid(), extra=header)
        refused = _stow_quiet(c, alone, submit, admin)
        assert wait_job(c, refused, admin)["state"] == "failed"
        models = tmp_path / "assets" / "models"
        r = c.post(
            "/v1/models",
            content=_bundle(models, "2.0.0"),
            headers={**auth(admin), "Content-Type": "application/zip"},
        )
        assert r.status_code == 201, r.text
        deploy = {"version": "2.0.0", "role": "canary", "percent": 1, "reason": p["script"]}
        r = c.post("/v1/models/lesions-test/deploy", json=deploy, headers=auth(admin))
        assert r.status_code == 200, r.text
    (tmp_path / "refused.zip").write_bytes(_bundle(models, "3.0.0", task=p["img"]))
    return {"ran": ran, "failed": failed, "refused": refused}


def _views(
    b: Any,
    base: str,
    tmp_path: Path,
    hits: list[str],
    p: dict[str, str],
    token: str,
    role: str,
    jobs: dict[str, str],
) -> None:
    page = Page(b, base, tmp_path / "shots")
    page.context.add_init_script(_WATCH)
    page.page.on("dialog", lambda d: (page.errors.append(f"dialog: {d.message}"), d.dismiss()))
    page.sign_in(token)
    row = page.page.locator(f"#worklist tr[data-id='{jobs['ran']}']")
    row.wait_for()
    shown = _inert(page, hits, f"{role}: worklist")
    assert p["accession"] in shown  # the accession, as text
    assert (p["img"] if role == "admin" else p["attr"]) in page.page.inner_text("#who")
    row.click()
    page.page.wait_for_selector("#findings tr.finding")
    page.page.wait_for_selector("#refused-series tbody tr")
    page.page.wait_for_selector("#trail td.details")
    page.page.wait_for_selector("#viewer-controls label.seg")  # once the volumes loaded
    if role == "admin":
        page.page.wait_for_selector("#patient:has-text('ID:')")
    shown = _inert(page, hits, f"{role}: study view")
    assert p["img"] in page.page.inner_text("#findings")  # the lesion label
    assert p["svg"] in page.page.inner_text("#organs")  # the organ label
    assert p["img"] in page.page.inner_text("#viewer-controls")  # its overlay toggle
    if role == "admin":
        assert p["script"] in page.page.inner_text("#patient")  # the Patient ID
    page.page.goto(f"{base}/#/job/{jobs['failed']}")
    page.page.wait_for_selector("section.study p:has-text('instance_invalid')")
    _inert(page, hits, f"{role}: failed job")
    if role == "admin":
        page.page.goto(f"{base}/#/job/{jobs['refused']}")
        page.page.wait_for_selector("#refused-series tbody tr")
        assert "Not analysed" in _inert(page, hits, f"{role}: refused series")
    page.page.goto(f"{base}/#/ops")
    page.page.wait_for_selector("[data-step='lesions-test'] .last-change")
    shown = _inert(page, hits, f"{role}: operations")
    assert p["script"] in page.page.inner_text("[data-step='lesions-test'] .last-change")
    if role == "admin":  # the server's refusal quotes the hostile task: shown as text
        page.page.click("[data-action=install]")
        page.page.set_input_files("#install-file", str(tmp_path / "refused.zip"))
        page.page.click("[data-action=confirm-install]")
        alert = page.page.locator("#install-dialog [role=alert]")
        alert.filter(has_text="install refused").wait_for()
        assert p["img"] in alert.inner_text()
        _inert(page, hits, f"{role}: install refused")
        page.page.click("[data-action=cancel-install]")
        # the browser logs the refusal's 422 (the answer checked above)
        page.errors = [e for e in page.errors if "status of 422" not in e]
    page.shot(f"hostile-data-{role}")
    assert page.errors == []
    # the detectors see markup that does reach the DOM (the test can fail)
    page.page.evaluate("(html) => document.body.insertAdjacentHTML('beforeend', html)", p["attr"])
    until(
        lambda: page.page.evaluate("() => window.__violations.length > 0"),
        "the page's policy to refuse the planted markup",
        10,
        step=0.1,
    )
    state = page.page.evaluate(_STATE)
    assert state["made"] and state["violations"], state
    assert hits == []  # refused by the policy, not fetched
    page.close()
