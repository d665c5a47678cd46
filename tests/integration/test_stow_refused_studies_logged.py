"""A STOW-RS request of many studies, most refused at submission (the queue holds one
job), against the real server: each refused instance is named in the response, and the
log holds the first few refused studies each, then one line with the count and codes
of the rest. Before, each refused study was a warning line of its own (refused parts
were summarised since session 37, refused studies not: a request may hold thousands)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from pydicom.uid import generate_uid
from tests.factories.dicomweb import failures, stow
from tests.factories.service import live_server, make_study, settings_for

from radserve.gateway.dicomweb.stow import LOGGED_REFUSALS

STUDIES = 200
SLICES = 3  # each study's
OUT_OF_RESOURCES = 0xA700  # a full queue, for each instance of a refused study


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("stow-refused-studies")
    settings = settings_for(
        root, scheduler__queue_limits__outpatient=1, scheduler__queue_limits__inpatient=1
    )
    with live_server(settings, warm=False) as live:
        # nothing runs: the first study keeps the queue's one place, every other is refused
        live["service"].scheduler.hold("test", "held by the test")
        yield live


def small_studies(templates: list[Path], count: int) -> list[tuple[bytes, str | None]]:
    """``count`` studies of ``len(templates)`` slices each (a volume the pipeline's
    selection takes: a one-image study is refused at the door since 2026-12-07), copies of
    ``templates`` with new UIDs."""
    parts: list[tuple[bytes, str | None]] = []
    for _ in range(count):
        study, series = generate_uid(), generate_uid()
        for template in templates:
            ds = pydicom.dcmread(template)
            ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
            ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
            out = io.BytesIO()
            ds.save_as(out, enforce_file_format=True)
            parts.append((out.getvalue(), "application/dicom"))
    return parts


def test_many_refused_studies_are_answered_each_and_logged_in_a_few_lines(
    server: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="radserve.gateway.dicomweb")
    templates = make_study(tmp_path / "study")[:SLICES]
    response = stow(server, small_studies(templates, STUDIES))
    assert response.status_code == 202, response.text  # the first study was taken
    refused = [reason for _, reason in failures(response)]
    assert set(refused) == {OUT_OF_RESOURCES}
    assert len(refused) == (STUDIES - 1) * SLICES
    lines = [r.getMessage() for r in caplog.records if r.name == "radserve.gateway.dicomweb.stow"]
    each = [m for m in lines if m.startswith("STOW study ")]
    assert len(each) == LOGGED_REFUSALS, lines[:20]
    assert all(m.endswith("not stored: queue_full") for m in each), each
    [rest] = [m for m in lines if "more study(ies) not stored" in m]
    more = STUDIES - 1 - LOGGED_REFUSALS
    assert rest.startswith(f"STOW: {more} more study(ies) not stored ({more} queue_full)"), rest
    assert len(lines) <= LOGGED_REFUSALS + 3, lines[-5:]  # and the request's summary
