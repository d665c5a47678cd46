"""``multipart/related`` bodies (RFC 2387) for DICOMweb: reading STOW-RS requests and
writing WADO-RS responses, plus the media-type negotiation both need.

Reading streams the body through python-multipart's push parser into one spooled
temporary file per part (memory stays bounded: a part past 1 MiB goes to disk, written
from a worker thread). A body that ends without its closing delimiter is refused, never
stored as shorter instances.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from radserve.errors import RadserveError
from radserve.service.errors import UnsupportedMediaError

SPOOL_BYTES = 1 << 20
_CHUNK = 1 << 20
MAX_PARTS = 100_000


class MalformedMultipartError(RadserveError):
    """The body is not the multipart/related it says it is (PS3.18: 400)."""

    code = "invalid_request"


class NotAcceptableError(RadserveError):
    """No representation the client accepts can be produced (HTTP 406)."""

    code = "not_acceptable"


@dataclass(frozen=True)
class MediaType:
    """A media type with lower-cased type and parameters (quotes removed)."""

    type: str
    params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> MediaType:
        head, *rest = _split(text, ";")
        params: dict[str, str] = {}
        for item in rest:
            key, sep, value = item.partition("=")
            if sep:
                params[key.strip().lower()] = value.strip().strip('"').strip()
        return cls(head.strip().lower(), params)


def _split(text: str, separator: str) -> list[str]:
    """Split on ``separator`` outside double quotes."""
    out, current, quoted = [], [], False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == separator and not quoted:
            out.append("".join(current))
            current = []
        else:
            current.append(char)
    out.append("".join(current))
    return out


def accepted_types(header: str | None) -> list[MediaType]:
    """The media ranges of an Accept header, q=0 ranges dropped; ``*/*`` when absent."""
    if not header or not header.strip():
        return [MediaType("*/*")]
    ranges = []
    for item in _split(header, ","):
        if not item.strip():
            continue
        media = MediaType.parse(item)
        try:
            if float(media.params.get("q", "1")) <= 0:
                continue
        except ValueError:
            continue
        ranges.append(media)
    return ranges


# --- reading (STOW-RS) --------------------------------------------------------------------
@dataclass
class Part:
    """One body part: its headers (lower-case names) and its bytes in a spooled file."""

    headers: dict[str, str]
    file: BinaryIO

    @property
    def media_type(self) -> str:
        return self.headers.get("content-type", "")


class _Collector:
    """python-multipart callbacks -> :class:`Part` objects."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.ended = False
        self._field = b""
        self._value = b""
        self._headers: dict[str, str] = {}
        self._current: BinaryIO | None = None

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._data,
            "on_end": self._end,
        }

    def _begin(self) -> None:
        self._headers = {}
        self._field = self._value = b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        name = self._field.decode("latin-1").strip().lower()
        self._headers[name] = self._value.decode("latin-1").strip()
        self._field = self._value = b""

    def _headers_finished(self) -> None:
        if len(self.parts) >= MAX_PARTS:
            raise MalformedMultipartError(f"more than {MAX_PARTS} parts in one request")
        # closed by close(), when the request is done with its parts
        self._current = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
        self.parts.append(Part(self._headers, self._current))

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._current is not None:
            self._current.write(data[start:end])

    def _end(self) -> None:
        self.ended = True

    def close(self) -> None:
        for part in self.parts:
            part.file.close()


def related_boundary(content_type: str | None, *, root_types: Sequence[str]) -> tuple[str, str]:
    """(boundary, root type) of a ``multipart/related`` Content-Type whose ``type``
    parameter is one of ``root_types`` (or absent: the first of them).

    Raises :class:`UnsupportedMediaError` (415) for another media type or root type, and
    :class:`MalformedMultipartError` (400) for a missing boundary."""
    media = MediaType.parse(content_type or "")
    if media.type != "multipart/related":
        raise UnsupportedMediaError(
            f"Content-Type {media.type or '(none)'} is not supported; send "
            f'multipart/related; type="{root_types[0]}" with one DICOM instance per part'
        )
    root = media.params.get("type", root_types[0]).lower()
    if root not in root_types:
        raise UnsupportedMediaError(
            f"multipart/related of type {root!r} is not supported; radserve stores "
            f"{', '.join(root_types)} parts (DICOM Part-10 files)"
        )
    boundary = media.params.get("boundary", "")
    if not boundary:
        raise MalformedMultipartError("the multipart/related Content-Type has no boundary")
    return boundary, root


@contextlib.asynccontextmanager
async def read_related(request: Request, boundary: str) -> AsyncIterator[list[Part]]:
    """The parts of the request body; their temporary files close on exit."""
    collector = _Collector()
    parser = MultipartParser(boundary, collector.callbacks())  # type: ignore[arg-type]
    try:
        try:
            async for chunk in request.stream():
                if chunk:
                    await run_in_threadpool(parser.write, chunk)
            parser.finalize()
        except MultipartParseError as exc:
            raise MalformedMultipartError(
                f"the multipart/related body cannot be parsed ({type(exc).__name__}); "
                "check the boundary and part headers"
            ) from None
        if not collector.ended:
            raise MalformedMultipartError(
                "the multipart/related body ends without its closing delimiter: the request "
                "was cut short; send it again"
            )
        if not collector.parts:
            raise MalformedMultipartError("the multipart/related body holds no part")
        yield collector.parts
    finally:
        collector.close()


# --- writing (WADO-RS) ----------------------------------------------------------------------
def new_boundary() -> str:
    return f"radserve-{uuid.uuid4().hex}"


def related_parts(
    files: Sequence[tuple[Path, str]], boundary: str, *, chunk: int = _CHUNK
) -> Iterator[bytes]:
    """A multipart/related body of the files as they are on disk, each part labelled
    ``application/dicom`` with its transfer syntax. (Iterated on a worker thread.)"""
    for path, syntax in files:
        head = f"--{boundary}\r\nContent-Type: application/dicom; transfer-syntax={syntax}\r\n\r\n"
        yield head.encode("ascii")
        with open(path, "rb") as handle:
            while data := handle.read(chunk):
                yield data
        yield b"\r\n"
    yield f"--{boundary}--\r\n".encode("ascii")


__all__ = [
    "MAX_PARTS",
    "MalformedMultipartError",
    "MediaType",
    "NotAcceptableError",
    "Part",
    "accepted_types",
    "new_boundary",
    "read_related",
    "related_boundary",
    "related_parts",
]
