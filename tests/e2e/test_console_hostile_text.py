"""Hostile text from a study's header in the console: a patient name holding markup, an
event handler, quotes and a right-to-left override, and an accession holding a script
tag are shown as the literal text they are (nothing runs, nothing is dropped), and the
override does not flip the patient ID beside the name. Debian's chromium against a real
``radserve serve``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tests.factories.console import Page, browser, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

pytestmark = pytest.mark.slow

NAME = "<img src=x onerror=window.__pwned=1>^\"O'Brien\u202eevil"
ACCESSION = "<script>x=1"  # SH: 16 characters at most
PATIENT_ID = "ID12345"

# Whether the first character of the ID span's text is drawn left of the second (as it is
# unless a bidi override from the name beside it reverses the run).
_ID_IN_ORDER = """() => {
  const spans = [...document.querySelectorAll('#patient span')]
  const text = spans.find((s) => s.textContent.startsWith('ID:')).firstChild
  const range = document.createRange()
  const left = (i) => {
    range.setStart(text, i)
    range.setEnd(text, i + 1)
    return range.getBoundingClientRect().left
  }
  return left(0) < left(1)
}"""


def test_markup_and_bidi_overrides_in_header_text_are_shown_inert(tmp_path: Path) -> None:
    need_browser()
    config = config_file(tmp_path)
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin")
    process = start_server(config, data, port, tmp_path / "server.log")
    extra = {
        "SpecificCharacterSet": "ISO_IR 192",
        "PatientName": NAME,
        "PatientID": PATIENT_ID,
        "AccessionNumber": ACCESSION,
    }
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as c:
            study = make_study(tmp_path / "s", extra=extra)
            job_id = c.post("/v1/studies", files=upload(study), headers=auth(admin)).json()["id"]
            assert wait_job(c, job_id, admin)["state"] == "succeeded"
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            p.page.on("dialog", lambda d: p.errors.append(f"dialog: {d.message}"))
            p.sign_in(admin)
            row = p.page.locator(f"#worklist tr[data-id='{job_id}']")
            row.wait_for()
            assert ACCESSION in row.inner_text()
            row.click()
            p.page.wait_for_selector("#patient:has-text('ID:')")
            patient = p.page.locator("#patient")
            assert NAME in patient.text_content()
            assert patient.locator("img").count() == 0
            assert p.page.evaluate("() => window.__pwned === undefined")
            assert p.page.evaluate(_ID_IN_ORDER)
            p.shot("hostile-text")
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)
