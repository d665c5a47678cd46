"""Long header text in the console: a Patient's Name, Patient ID, accession, Study and
Series Description at the longest DICOM allows (64 characters of one unbroken word; an
accession's 16), a hostile 10,000-character value of each, and a key name of 128
unbroken characters (the longest `keys create` takes), in Debian's chromium against a
real ``radserve serve``.

Before, such text pushed the page wider than the screen: the patient line was one flex
row of unbreakable spans, the study view's heading one line, a worklist cell as wide as
its accession, the key name beside the Sign out button; the buttons went off the screen
(the Sign out button past the right edge, the worklist's list box scrolled sideways).
Now every place header text is shown cuts it with an ellipsis at its box and keeps the
whole text in its tooltip (``title``): no page, list box or panel is wider than the
screen, every button is on it, and the text itself is all still in the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.console import Page, browser, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

pytestmark = pytest.mark.slow

KEY_NAME = "K" * 128
LONGEST = {  # the longest values DICOM allows, one unbroken word each
    "PatientName": "N" * 64,  # PN: 64 characters per component group
    "PatientID": "I" * 64,  # LO
    "AccessionNumber": "A" * 16,  # SH
    "StudyDescription": "S" * 64,  # LO
    "SeriesDescription": "D" * 64,  # LO
}
HOSTILE = {  # far past them: what a broken or hostile sender may still put in a header
    "PatientName": "n" * 10_000,
    "PatientID": "i" * 10_000,
    "AccessionNumber": "a" * 10_000,
    "StudyDescription": "s" * 10_000,
    "SeriesDescription": "d" * 10_000,
}

# Every box given (selector -> all its elements) that sticks out of the viewport or out
# of the list box around it, and how far the page itself is wider than the viewport.
_OVERFLOW = """(selectors) => {
  const width = document.documentElement.clientWidth
  const out = []
  for (const selector of selectors) {
    const found = document.querySelectorAll(selector)
    if (!found.length) out.push(`${selector}: not on the page`)
    for (const el of found) {
      const r = el.getBoundingClientRect()
      if (r.width === 0 && r.height === 0) continue
      if (r.left < -0.5 || r.right > width + 0.5) {
        out.push(`${selector}: ${r.left}..${r.right} of ${width}`)
      }
      const box = el.closest('.scroll')
      if (box && box !== el) {
        const b = box.getBoundingClientRect()
        if (r.right > b.right + 0.5) {
          out.push(`${selector}: right ${r.right} past its list box's ${b.right}`)
        }
      }
    }
  }
  const page = document.documentElement.scrollWidth
  if (page > width) out.push(`the page is ${page} px wide in a ${width} px viewport`)
  for (const box of document.querySelectorAll('.scroll')) {
    if (box.scrollWidth > box.clientWidth + 1) {
      out.push(`a list box scrolls sideways: ${box.scrollWidth} > ${box.clientWidth}`)
    }
  }
  return out
}"""

# the text an element holds in full, and its tooltip
_TEXT_AND_TITLE = """(selector) =>
  [...document.querySelectorAll(selector)].map((el) => [el.textContent, el.title])"""


def _submit(c: httpx.Client, key: str, folder: Path, extra: dict[str, str]) -> str:
    study = make_study(folder, extra={"SpecificCharacterSet": "ISO_IR 192", **extra})
    r = c.post("/v1/studies", files=upload(study), headers=auth(key))
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    assert wait_job(c, job_id, key)["state"] in ("succeeded", "failed")
    return job_id


def _no_overflow(p: Page, *selectors: str) -> None:
    problems = p.page.evaluate(_OVERFLOW, list(selectors))
    assert problems == [], problems


def test_long_header_text_stays_inside_the_screen_and_its_boxes(tmp_path: Path) -> None:
    need_browser()
    config = config_file(tmp_path)
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin", name=KEY_NAME)
    process = start_server(config, data, port, tmp_path / "server.log")
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as c:
            jobs = {
                "longest": _submit(c, admin, tmp_path / "longest", LONGEST),
                "hostile": _submit(c, admin, tmp_path / "hostile", HOSTILE),
            }
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            p.sign_in(admin)
            for job_id in jobs.values():
                p.page.locator(f"#worklist tr[data-id='{job_id}']").wait_for()
            p.page.wait_for_timeout(300)  # a second render of the rows (the ticker)
            _no_overflow(p, "header#top", "#who", "#signout", "#nav a", ".filters", "#worklist td")
            cells = p.page.evaluate(_TEXT_AND_TITLE, "#worklist td.accession .clip")
            for value in (LONGEST["AccessionNumber"], HOSTILE["AccessionNumber"]):
                assert [value, value] in cells  # all of it in the page, and in the tooltip
            assert p.page.locator("#who .clip").get_attribute("title") == KEY_NAME
            p.shot("long-header-worklist")

            for name, job_id in jobs.items():
                values = LONGEST if name == "longest" else HOSTILE
                p.goto(f"/#/job/{job_id}")
                p.page.wait_for_selector("#patient:has-text('ID:')")
                p.page.wait_for_selector("#trail")
                shown: list[str] = [
                    ".study-head h1",
                    ".study-head a",
                    ".study-head .badge",
                    "#patient .field",
                    "#trail-card",
                    "#signout",
                ]
                if p.page.locator("#viewer-controls").count():
                    p.page.wait_for_selector("#viewer-controls button")
                    shown += ["#viewer-controls button", "#downloads a", "#findings"]
                _no_overflow(p, *shown)
                fields = dict(p.page.evaluate(_TEXT_AND_TITLE, "#patient .clip"))
                assert fields[values["PatientName"]] == values["PatientName"]
                assert fields[values["PatientID"]] == values["PatientID"]
                heading = p.page.locator(".study-head h1 .clip")
                assert heading.text_content() == values["AccessionNumber"]
                # the study and series descriptions are not shown (free text that may
                # hold names): nothing of them to overflow
                text = p.page.locator("body").inner_text()
                assert values["StudyDescription"][:16] not in text
                assert values["SeriesDescription"][:16] not in text
                p.shot(f"long-header-study-{name}")
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)


def test_a_narrow_window_keeps_the_header_s_buttons(tmp_path: Path) -> None:
    """The top bar at a narrow window (a tablet on a cart): the key name gives way, the
    Sign out button stays on screen."""
    need_browser()
    config = config_file(tmp_path)
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin", name=KEY_NAME)
    process = start_server(config, data, port, tmp_path / "server.log")
    try:
        base = f"http://127.0.0.1:{port}"
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            p.page.set_viewport_size({"width": 640, "height": 800})
            p.sign_in(admin)
            p.page.wait_for_selector("#worklist")
            box: Any = p.page.locator("#signout").bounding_box()
            assert box is not None and box["x"] + box["width"] <= 640, box
            who: Any = p.page.locator("#who").bounding_box()
            assert who is not None and who["x"] + who["width"] <= box["x"], (who, box)
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)
