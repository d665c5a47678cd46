"""The study view offers the downloads that name the patient (FHIR Bundle, DICOM SEG and
SR) only to a session whose role is in ``console.phi_roles``: a read session was
offered them (and got them) though its page hides the patient's details. Debian's
chromium against the real app with the console installed."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.service import ServerThread, auth, make_study, settings_for, wait_job

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.service import Service

pytestmark = pytest.mark.slow


def _stow(c: httpx.Client, files: list[Path], token: str) -> str:
    """A study through STOW-RS (its job writes SEG and SR); the job's id."""
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for path in files:
        body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        body += path.read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    kind = f'multipart/related; type="application/dicom"; boundary={boundary}'
    r = c.post("/dicomweb/studies", content=body, headers={"Content-Type": kind, **auth(token)})
    assert r.status_code in (200, 202), r.text
    return r.headers["link"][len("</v1/jobs/") : -len('>; rel="related"')]


def _hrefs(p: Page, job_id: str) -> list[str]:
    p.goto(f"/#/job/{job_id}")
    p.page.wait_for_selector("#downloads a", timeout=ms(60))
    links = p.page.locator("#downloads a")
    return [links.nth(i).get_attribute("href") or "" for i in range(links.count())]


def test_only_phi_roles_are_offered_patient_identifying_downloads(tmp_path: Path) -> None:
    need_browser()
    service = Service(settings_for(tmp_path))
    app = create_app(service)
    install_console(app, service)
    _, admin = service.store.create_api_key(name="admin", role="admin")
    _, reader = service.store.create_api_key(name="reader", role="read")
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        job_id = _stow(c, make_study(tmp_path / "s"), admin)
        assert wait_job(c, job_id, admin)["state"] == "succeeded"
        with browser() as b:
            p = Page(b, srv.url, tmp_path / "shots")
            p.sign_in(reader)
            p.page.wait_for_selector("#worklist")
            hrefs = _hrefs(p, job_id)
            assert any(h.endswith("/report") for h in hrefs), hrefs
            assert any(h.endswith("/volume") for h in hrefs), hrefs
            assert not [h for h in hrefs if h.endswith("/fhir") or ".dcm" in h], hrefs
            p.page.wait_for_selector("#patient:has-text('hidden for this role')")
            assert p.errors == []
            p.close()
        with browser() as b:
            p = Page(b, srv.url, tmp_path / "shots-admin")
            p.sign_in(admin)
            p.page.wait_for_selector("#worklist")
            hrefs = _hrefs(p, job_id)
            assert any(h.endswith("/fhir") for h in hrefs), hrefs
            assert any(h.endswith("/files/organs-seg.dcm") for h in hrefs), hrefs
            assert any(h.endswith("/files/measurements-sr.dcm") for h in hrefs), hrefs
            assert p.errors == []
            p.close()
