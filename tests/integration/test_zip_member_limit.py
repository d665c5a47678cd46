"""A zip archive listing more entries than ``ingest.max_archive_members`` is refused from
its end record, at the upload's door (422 ``archive_rejected``, nothing stored, no job)
and at ingest, before zipfile parses its central directory.

Probe (2026-12-06): 200,000 empty members took ~13 s and ~270 MB in the door's sniff
(zipfile parses the whole directory to see whether the archive holds files) and ~100 s
in discovery (each member opened), and the only limit (200,000, not a setting) was
checked after the parse: 200,000 members passed it."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.service import auth, live_server, settings_for

from radserve.ingest import IngestPolicy, discover_series
from radserve.service.sniff import sniff
from radserve.zip_members import ArchiveRejectedError, zip_member_count

LIMIT = 300


def _zip(count: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for n in range(count):
            archive.writestr(f"m{n:06d}.dcm", b"")
    return buffer.getvalue()


def _with_broken_directory(data: bytes) -> bytes:
    """The archive with its central directory overwritten: zipfile cannot parse it, so
    only a refusal from the end record can name the count."""
    start = data.rfind(b"PK\x05\x06")
    (offset,) = (int.from_bytes(data[start + 16 : start + 20], "little"),)
    return data[:offset] + b"\x00" * (start - offset) + data[start:]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("zip-members")
    settings = settings_for(root, ingest__max_archive_members=LIMIT)
    with live_server(settings) as live:
        yield live


def test_the_count_is_read_from_the_end_record_zip64_included() -> None:
    assert zip_member_count(io.BytesIO(_zip(LIMIT + 1))) == LIMIT + 1
    assert zip_member_count(io.BytesIO(_zip(70_000))) == 70_000  # a ZIP64 end record
    assert zip_member_count(io.BytesIO(b"PK\x03\x04 not an archive")) is None


def test_sniff_refuses_before_parsing_the_directory() -> None:
    stream = io.BytesIO(_with_broken_directory(_zip(LIMIT + 1)))
    with pytest.raises(
        ArchiveRejectedError,
        match=rf"file 1 of 1: zip archive lists {LIMIT + 1} members, more than "
        rf"ingest\.max_archive_members={LIMIT}",
    ):
        sniff(stream, 1, 1, max_archive_members=LIMIT)
    assert stream.tell() == 0
    sniff(io.BytesIO(_zip(LIMIT)), 1, 1, max_archive_members=LIMIT)  # at the limit: taken


def test_ingest_refuses_an_archive_over_the_limit(tmp_path: Path) -> None:
    (tmp_path / "study.zip").write_bytes(_zip(LIMIT + 1))
    with pytest.raises(ArchiveRejectedError, match=rf"lists {LIMIT + 1} members"):
        discover_series(tmp_path, policy=IngestPolicy(max_archive_members=LIMIT))


def test_the_default_limit_refuses_the_200k_archive_a_zip64_one_included(tmp_path: Path) -> None:
    (tmp_path / "study.zip").write_bytes(_zip(70_000))
    with pytest.raises(ArchiveRejectedError, match=r"lists 70000 members, more than .*=50000"):
        discover_series(tmp_path)


def test_an_upload_over_the_limit_is_refused_at_the_door(server: dict[str, Any]) -> None:
    c, key = server["client"], server["submit"]
    part = ("study.zip", _zip(LIMIT + 1), "application/zip")
    answer = c.post("/v1/studies", files=[("files", part)], headers=auth(key))
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "archive_rejected"
    assert f"lists {LIMIT + 1} members" in error["message"]
    assert c.get("/v1/jobs", headers=auth(server["read"])).json()["items"] == []
