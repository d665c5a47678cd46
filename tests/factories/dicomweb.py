"""A DICOMweb client's side of the tests: multipart/related bodies for STOW-RS, the
store response's attributes, and the parts of a WADO-RS response. One definition for
the DICOMweb, own-results, store-outage and imported-model serve tests."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pydicom

from tests.factories.service import auth

REFERENCED = "00081199"  # Referenced SOP Sequence
FAILED = "00081198"  # Failed SOP Sequence
FAILURE_REASON = "00081197"
SOP_INSTANCE = "00081155"  # Referenced SOP Instance UID


def related(
    parts: Sequence[tuple[bytes, str | None]],
    *,
    root: str | None = "application/dicom",
    close: bool = True,
) -> tuple[bytes, str]:
    """A multipart/related body (the test is the client) and its Content-Type."""
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for data, media in parts:
        head = f"--{boundary}\r\n" + (f"Content-Type: {media}\r\n" if media else "") + "\r\n"
        body += head.encode() + data + b"\r\n"
    if close:
        body += f"--{boundary}--\r\n".encode()
    content_type = "multipart/related" + (f'; type="{root}"' if root else "")
    return body, f"{content_type}; boundary={boundary}"


def dicom_parts(paths: Sequence[Path]) -> list[tuple[bytes, str | None]]:
    return [(p.read_bytes(), "application/dicom") for p in paths]


def stow(
    server: dict[str, Any],
    parts: Sequence[tuple[bytes, str | None]],
    *,
    path: str = "/dicomweb/studies",
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> httpx.Response:
    """POST ``parts`` over STOW-RS with ``server``'s client and submit key."""
    body, content_type = related(parts, **options)
    sent = {"Content-Type": content_type, **auth(server["submit"]), **(headers or {})}
    return server["client"].post(path, content=body, headers=sent, params=params)


def referenced(response: httpx.Response) -> list[str]:
    return [i[SOP_INSTANCE]["Value"][0] for i in response.json()[REFERENCED].get("Value", [])]


def failures(response: httpx.Response) -> list[tuple[str | None, int]]:
    """(SOP Instance UID or None, Failure Reason) of each failed part."""
    return [
        (i.get(SOP_INSTANCE, {}).get("Value", [None])[0], i[FAILURE_REASON]["Value"][0])
        for i in response.json()[FAILED].get("Value", [])
    ]


def sop_uids(paths: Sequence[Path]) -> list[str]:
    return [str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in paths]


def job_of(response: httpx.Response) -> str:
    """The job id a STOW-RS response links to."""
    link = response.headers["link"]
    assert link.startswith("</v1/jobs/") and link.endswith('>; rel="related"'), link
    return link[len("</v1/jobs/") : -len('>; rel="related"')]


def split_related(response: httpx.Response) -> list[tuple[str, bytes]]:
    """(part Content-Type, bytes) of a multipart/related response."""
    media = response.headers["content-type"]
    assert media.startswith('multipart/related; type="application/dicom"'), media
    boundary = media.split("boundary=")[1].strip('"').encode()
    body = response.content
    assert body.endswith(b"--" + boundary + b"--\r\n")
    parts = []
    for chunk in body.split(b"--" + boundary)[1:-1]:
        head, _, data = chunk[2:].partition(b"\r\n\r\n")
        parts.append((head.decode().split(":", 1)[1].strip(), data[:-2]))
    return parts
