"""Target (c): request bodies of the two upload doors, as the routes read them.

- STOW-RS: the Content-Type through
  :func:`~radserve.gateway.dicomweb.multipart.related_boundary`, the body through
  :class:`~radserve.gateway.dicomweb.multipart.RelatedParser` in the chunks a client's
  writes arrive in (a boundary may straddle two), then each part's media type through
  the STOW-RS part check;
- the upload form (``POST /v1/studies``): Starlette's parser under radserve's spool
  budget, through the route's own reader (``_read_form``: Content-Type check, then
  :func:`radserve.api.forms.read_form`).

Input layout: byte 0 chooses the door (even: STOW-RS) and the chunk size; the Content-Type
value runs to the first newline; the body is the rest."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from radserve.api.routes.studies import _read_form
from radserve.gateway.dicomweb.multipart import RelatedParser, related_boundary
from radserve.gateway.dicomweb.stow import DICOM_MEDIA, StowPart, check_part
from tests.fuzz.invariant import refusals_only
from tests.fuzz.targets import _phantom

COVERED = (
    "radserve.gateway.dicomweb.multipart",
    "radserve.gateway.dicomweb.stow",
    "radserve.api.forms",
    "radserve.api.routes.studies",
    "radserve.spool",
    "radserve.media_types",
    "starlette.formparsers",
    "multipart",
    "python_multipart",
)
_BOUNDARY = "fuzzboundary"


def _body(parts: list[tuple[bytes, bytes]], crlf: bytes = b"\r\n") -> bytes:
    out = b"preamble" + crlf
    for headers, content in parts:
        out += b"--" + _BOUNDARY.encode() + crlf + headers + crlf + crlf + content + crlf
    return out + b"--" + _BOUNDARY.encode() + b"--" + crlf


def seeds() -> list[bytes]:
    instance = _phantom.instances()[0]
    related = f'multipart/related; type="{DICOM_MEDIA}"; boundary={_BOUNDARY}'.encode()
    form = f"multipart/form-data; boundary={_BOUNDARY}".encode()
    dicom = b"Content-Type: application/dicom"
    file_field = b'Content-Disposition: form-data; name="files"; filename="a.dcm"'
    return [
        bytes([0]) + related + b"\n" + _body([(dicom, instance), (dicom, b"not dicom")]),
        bytes([6]) + related + b"\n" + _body([(dicom, instance)], b"\n"),
        bytes([1]) + form + b"\n" + _body([(file_field, instance)]),
        bytes([9])
        + form
        + b"\n"
        + _body([(b'Content-Disposition: form-data; name="priority"', b"urgent")]),
    ]


def _split(data: bytes) -> tuple[int, str, bytes]:
    if not data:
        return 0, "", b""
    head, _, body = data[1:].partition(b"\n")
    return data[0], head.decode("latin-1"), body  # header values arrive as latin-1


def _chunks(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)] or [b""]


def one_input(data: bytes) -> None:
    selector, content_type, body = _split(data)
    chunks = _chunks(body, 1 + (selector >> 1) * 61)
    if selector % 2 == 0:
        _stow(content_type, chunks)
    else:
        asyncio.run(_form(content_type, chunks))


def _stow(content_type: str, chunks: list[bytes]) -> None:
    with refusals_only():
        boundary, _ = related_boundary(content_type, root_types=(DICOM_MEDIA,))
        parser = RelatedParser(boundary)
        try:
            for chunk in chunks:
                if chunk and not parser.complete:
                    parser.feed(chunk)
            parser.finish()
            for number, part in enumerate(parser.parts, start=1):
                check_part(number, StowPart(part.media_type, part.file), None)
        finally:
            parser.close()


async def _form(content_type: str, chunks: list[bytes]) -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks
    ]
    messages.append({"type": "http.request", "body": b"", "more_body": False})

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/studies",
        "headers": [(b"content-type", content_type.encode("latin-1"))],
        "query_string": b"",
    }
    with refusals_only():
        async with _read_form(Request(scope, receive)) as form:
            for _, value in form.multi_items():
                if isinstance(value, UploadFile):
                    value.file.read(1)
