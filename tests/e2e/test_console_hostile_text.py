"""Hostile text from a study's header in the console: a patient name holding markup, an
event handler, quotes and a right-to-left override, and an accession holding a script
tag are shown as the literal text they are (nothing runs, nothing is dropped), and the
override does not flip the patient ID beside the name. Every such span is isolated
(``<bdi>``), so an Arabic API key name ending in a right-to-left override does not
reverse the role written after it in the header (it did: one text node). Debian's
chromium against a real ``radserve serve``."""

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

# an Arabic key name holding markup (a bidi override in a key name is refused at
# `keys create` since session 36; the patient's name above still carries one)
KEY_NAME = "مدير <b>x</b>"

# Whether the characters of ``needle`` in the text node under ``selector`` that holds it
# are drawn left to right (as they are unless a bidi override before them reverses the run).
_IN_ORDER = """([selector, needle]) => {
  const walker = document.createTreeWalker(document.querySelector(selector), NodeFilter.SHOW_TEXT)
  let node = walker.nextNode()
  while (node && !node.data.includes(needle)) node = walker.nextNode()
  if (!node) return `no text node holds ${needle}`
  const at = node.data.indexOf(needle)
  const range = document.createRange()
  const left = (i) => {
    range.setStart(node, at + i)
    range.setEnd(node, at + i + 1)
    return range.getBoundingClientRect().left
  }
  for (let i = 0; i + 1 < needle.length; i++) if (!(left(i) < left(i + 1))) return false
  return true
}"""


def test_markup_and_bidi_overrides_in_header_text_are_shown_inert(tmp_path: Path) -> None:
    need_browser()
    config = config_file(tmp_path)
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin", name=KEY_NAME)
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
            # the ID beside the name, and the role beside the key name, in order
            assert p.page.evaluate(_IN_ORDER, ["#patient", PATIENT_ID]) is True
            assert p.page.evaluate(_IN_ORDER, ["#patient", "ID:"]) is True
            assert p.page.evaluate(_IN_ORDER, ["#who", "admin"]) is True
            # each server text is isolated, whatever box it sits in
            assert patient.locator("bdi").all_text_contents()[:2] == [NAME, PATIENT_ID]
            assert p.page.locator("h1 bdi").text_content() == ACCESSION
            assert p.page.locator("#who bdi").text_content() == KEY_NAME
            p.shot("hostile-text")
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)
