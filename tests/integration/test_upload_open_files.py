"""Uploads with more parts on disk than the open-files limit allows (a real server; the
test process's soft limit lowered to make the count small): each part past the
request's in-memory budget holds an open file until the request ends, so many small
parts after it ran the server out of file descriptors (EMFILE: a 500). Now the request is
refused with a 413 that says why, and the server goes on serving."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.service import auth, live_server, settings_for

from radserve.spool import PART_MEMORY_BYTES, REQUEST_MEMORY_BYTES

BOUNDARY = "open-files-test"


@pytest.fixture
def low_limit() -> Iterator[int]:
    """The soft open-files limit of this process (the server's) lowered to what is open
    now + 600; restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = len(os.listdir("/proc/self/fd")) + 600
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        yield lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _body(small_parts: int, form: bool) -> bytes:
    """The in-memory budget filled by 1 MiB parts, then ``small_parts`` tiny ones (each
    then goes to disk: the budget left is 1 byte)."""
    big = b"\0" * PART_MEMORY_BYTES
    parts = [big] * (REQUEST_MEMORY_BYTES // PART_MEMORY_BYTES) + [b"xy"] * small_parts
    if form:
        head = b'Content-Disposition: form-data; name="files"; filename="f.dcm"\r\n'
    else:
        head = b"Content-Type: application/dicom\r\n"
    out = [b"--%s\r\n%s\r\n%s\r\n" % (BOUNDARY.encode(), head, p) for p in parts]
    return b"".join(out) + b"--%s--\r\n" % BOUNDARY.encode()


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/studies", f"multipart/form-data; boundary={BOUNDARY}"),
        ("/dicomweb/studies", f'multipart/related; type="application/dicom"; boundary={BOUNDARY}'),
    ],
)
def test_parts_past_the_open_files_bound_are_refused_with_413(
    tmp_path: Path, low_limit: int, path: str, content_type: str
) -> None:
    with live_server(settings_for(tmp_path), warm=False) as live:
        c, key = live["client"], live["submit"]
        body = _body(low_limit, form=path == "/v1/studies")
        headers = {**auth(key), "Content-Type": content_type}
        r = c.post(path, content=body, headers=headers)
        assert r.status_code == 413, r.text[:500]
        error = r.json()["error"]
        assert error["code"] == "upload_too_large"
        assert f"one request may hold {low_limit // 4}" in error["message"]
        assert c.get("/healthz").status_code == 200  # and it goes on serving
