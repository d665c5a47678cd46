"""A zipped study whose archive is damaged is answered by what is wrong with it, never a
500: a ZIP64 locator whose offset points past the file (seeking there raised
OverflowError in the end-record reader), a member whose Deflate or LZMA data is damaged
(zlib.error / LZMAError from the study's fingerprint, which reads every member). Found by
the trial of 2026-12-08: each was HTTP 500 at ``POST /v1/studies``. A study with one
damaged member runs on the members that read, and its report says one was skipped."""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.service import auth, live_server, make_study, settings_for, wait_job


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("damaged-zip")
    with live_server(settings_for(root / "server")) as running:
        yield running


def _zipped(files: list[Path], method: int = zipfile.ZIP_DEFLATED) -> bytearray:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for path in files:
            archive.writestr(path.name, path.read_bytes())
    return bytearray(buffer.getvalue())


def _post(live: dict[str, Any], body: bytes) -> Any:
    files = [("files", ("study.zip", bytes(body), "application/zip"))]
    return live["client"].post("/v1/studies", files=files, headers=auth(live["submit"]))


def test_a_zip64_locator_past_the_file_is_not_a_server_error(
    live: dict[str, Any], tmp_path: Path
) -> None:
    good = _zipped(make_study(tmp_path / "study"))
    end = bytes(good).rfind(b"PK\x05\x06")
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, 2**63 + 5, 1)
    answer = _post(live, bytes(good[:end]) + locator + bytes(good[end:]))
    assert answer.status_code != 500, answer.text
    if answer.status_code == 202:  # the plain end record is read: the study runs
        job = wait_job(live["client"], answer.json()["id"], live["read"])
        assert job["state"] in {"succeeded", "failed"}, job
    else:
        assert 400 <= answer.status_code < 500 and answer.json()["error"]["message"]


@pytest.mark.parametrize(
    "method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_LZMA], ids=["deflate", "lzma"]
)
def test_a_damaged_member_is_skipped_and_said_and_the_rest_of_the_study_runs(
    live: dict[str, Any], tmp_path: Path, method: int
) -> None:
    files = make_study(tmp_path / "study")
    body = _zipped(files, method)
    name = files[0].name.encode()
    data = bytes(body).find(name) + len(name)  # the first member's compressed data
    for k in range(data + 30, data + 90):
        body[k] ^= 0x5A
    answer = _post(live, bytes(body))
    assert answer.status_code == 202, answer.text
    job = wait_job(live["client"], answer.json()["id"], live["read"])
    assert job["state"] == "succeeded", job
    report = live["client"].get(f"/v1/jobs/{job['id']}/report", headers=auth(live["read"]))
    said = [w["message"] for w in report.json()["warnings"] if w["stage"] == "ingest"]
    assert any("1 file(s) of the input were skipped, unreadable" in w for w in said), said
