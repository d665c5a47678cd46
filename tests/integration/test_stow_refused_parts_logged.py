"""A STOW-RS request of 1,000 parts that are not DICOM, beside a good instance, against
the real server (uvicorn on loopback, httpx): every refused part is named in the
response, the good one is stored, and the log holds a bounded number of lines about
them: the first few refusals each, then one line with the count and codes of the rest
(found by the hospital-edge probe of session 37: one warning per part, 1,000 lines for
this request, and a request may hold 100,000 parts)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.dicomweb import dicom_parts, failures, referenced, sop_uids, stow
from tests.factories.service import live_server, make_study, settings_for

from radserve.gateway.dicomweb.stow import LOGGED_REFUSALS

PARTS = 1000
NOT_DICOM = 0xC000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("stow-refused")
    with live_server(settings_for(root), warm=False) as live:
        yield live


def test_a_thousand_refused_parts_are_answered_each_and_logged_in_a_few_lines(
    server: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="radserve.gateway.dicomweb")
    # a study of three slices (one image alone is refused at the door since 2026-12-07)
    good = make_study(tmp_path / "study")[:3]
    junk: list[tuple[bytes, str | None]] = [(b"x" * 16, "application/dicom")] * PARTS
    response = stow(server, junk + dicom_parts(good))
    assert response.status_code == 202, response.text  # some stored
    assert referenced(response) == sop_uids(good)
    assert [reason for _, reason in failures(response)] == [NOT_DICOM] * PARTS
    lines = [r.getMessage() for r in caplog.records if r.name == "radserve.gateway.dicomweb.stow"]
    each = [m for m in lines if m.startswith("STOW part ")]
    assert len(each) == LOGGED_REFUSALS, lines[:20]
    assert each[0].startswith("STOW part 1 not stored: not a readable DICOM")
    [rest] = [m for m in lines if "more part(s) not stored" in m]
    assert f"{PARTS - LOGGED_REFUSALS} more part(s) not stored" in rest
    assert f"parts {LOGGED_REFUSALS + 1} to {PARTS}: {PARTS - LOGGED_REFUSALS} not_dicom" in rest
    assert len(lines) <= LOGGED_REFUSALS + 3, lines[-5:]  # and the request's summary
