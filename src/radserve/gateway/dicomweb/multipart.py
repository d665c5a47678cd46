"""``multipart/related`` bodies (RFC 2387) for DICOMweb: reading STOW-RS requests and
writing WADO-RS responses (media types and the Accept header: :mod:`radserve.media_types`).

Reading is a small streaming parser of RFC 2046 section 5.1.1, written here because
neither multipart library at hand reads what DICOMweb clients send:
python-multipart (0.0.x, the form parser FastAPI uses) refuses a preamble before the
first delimiter ("Expected boundary character"), transport padding after the first
delimiter and LF-only line endings; ``multipart`` (2.x) is form-data only (a part
without Content-Disposition is an error) and refuses LF line breaks and padding; the
standard library's ``email`` parser reads the whole body into memory. This one accepts
a preamble (up to :data:`MAX_PREAMBLE` bytes) and an epilogue (ignored), transport
padding (spaces/tabs) after any delimiter, and LF-only line endings (the first
delimiter line decides CRLF or LF for the body), and streams each part into its own
spooled temporary file (a part past 1 MiB, or any part once the request's parts in
memory reach :data:`radserve.spool.REQUEST_MEMORY_BYTES`, goes to disk, written from a
worker thread), so memory stays bounded whatever the part sizes and counts. A body
that ends without its close delimiter is refused, never stored as shorter instances.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from anyio import to_thread

from radserve.errors import RadserveError, UnsupportedMediaError, quoted
from radserve.media_types import MediaType
from radserve.spool import SpoolBudget

_CHUNK = 1 << 20
MAX_PARTS = 100_000
MAX_PREAMBLE = 64 << 10
MAX_PART_HEADERS = 16 << 10
MAX_BOUNDARY = 200  # RFC 2046 allows 70; a little slack for lenient clients


class MalformedMultipartError(RadserveError):
    """The body is not the multipart/related it says it is (PS3.18: 400)."""

    code = "invalid_request"


# --- reading (STOW-RS) --------------------------------------------------------------------
@dataclass
class Part:
    """One body part: its headers (lower-case names) and its bytes in a spooled file."""

    headers: dict[str, str]
    file: BinaryIO

    @property
    def media_type(self) -> str:
        return self.headers.get("content-type", "")


_PREAMBLE, _HEADERS, _BODY, _EPILOGUE = range(4)
_LWSP = b" \t"


class RelatedParser:
    """Push parser of a multipart body (RFC 2046 5.1.1): ``feed`` chunks, then
    ``finish``; :attr:`parts` holds each part's headers and bytes (in spooled files).

    Synchronous and blocking (the part files may write to disk): call it from a worker
    thread. Raises :class:`MalformedMultipartError` for a body it cannot read."""

    def __init__(self, boundary: str) -> None:
        if not boundary or len(boundary) > MAX_BOUNDARY:
            raise MalformedMultipartError(
                f"the multipart boundary must be 1 to {MAX_BOUNDARY} characters"
            )
        try:
            self._dash = b"--" + boundary.encode("ascii")
        except UnicodeEncodeError:
            raise MalformedMultipartError("the multipart boundary is not ASCII") from None
        self.parts: list[Part] = []
        self._budget = SpoolBudget()  # the request's parts in memory, at most
        self._limit = 0  # the last part's spool size
        self._state = _PREAMBLE
        self._buffer = b""
        self._seen = 0  # bytes of preamble skipped
        self._delimiter = b"\r\n" + self._dash  # set from the first delimiter line

    @property
    def complete(self) -> bool:
        """Whether the close delimiter was read."""
        return self._state == _EPILOGUE

    def feed(self, data: bytes) -> None:
        if self._state == _EPILOGUE:
            return  # the epilogue is ignored (RFC 2046)
        self._buffer += data
        while True:
            if self._state == _PREAMBLE:
                progressed = self._preamble()
            elif self._state == _HEADERS:
                progressed = self._headers()
            elif self._state == _BODY:
                progressed = self._body()
            else:
                self._buffer = b""
                return
            if not progressed:
                return

    def finish(self) -> None:
        """The body ended: refuse it unless its close delimiter was read."""
        if self._state != _EPILOGUE:
            where = "before its first delimiter" if self._state == _PREAMBLE else "mid-part"
            raise MalformedMultipartError(
                f"the multipart/related body ends {where}, without its close delimiter "
                f"(--boundary--): the request was cut short or the boundary is wrong"
            )

    def close(self) -> None:
        for part in self.parts:
            part.file.close()

    # --- states: each returns whether it consumed something and may go on ------------
    def _preamble(self) -> bool:
        buffer, dash = self._buffer, self._dash
        start = 0
        while True:
            at = buffer.find(dash, start)
            if at < 0:
                break
            if (at == 0 and self._seen == 0) or buffer[at - 1 : at] == b"\n":
                after = self._after_delimiter(at + len(dash))
                if after is None:
                    self._keep(at)  # wait for the rest of the delimiter line
                    return False
                if after >= 0:
                    crlf = buffer[after - 2 : after] == b"\r\n"
                    self._delimiter = (b"\r\n" if crlf else b"\n") + dash
                    self._begin_part(after)
                    return True
                if after == _CLOSE:
                    self._state = _EPILOGUE  # an empty body: refused as "no part"
                    return True
            start = at + 1
        keep = max(0, len(buffer) - len(dash) - 1)  # the tail, with the byte before it
        self._seen += keep
        if self._seen > MAX_PREAMBLE:
            raise MalformedMultipartError(
                f"no multipart delimiter (--boundary) in the first {MAX_PREAMBLE} bytes: "
                "the body is not multipart/related or the boundary is wrong"
            )
        self._buffer = buffer[keep:]
        return False

    def _headers(self) -> bool:
        buffer = self._buffer
        end, skip = _blank_line(buffer)
        if (end if end >= 0 else len(buffer)) > MAX_PART_HEADERS:
            raise MalformedMultipartError(
                f"a part's headers exceed {MAX_PART_HEADERS} bytes (or never end)"
            )
        if end < 0:
            return False
        headers: dict[str, str] = {}
        name = ""
        for line in buffer[:end].decode("latin-1").splitlines():
            if line[:1] in (" ", "\t") and name:  # obsolete line folding
                headers[name] += " " + line.strip()
                continue
            key, colon, value = line.partition(":")
            if not colon or not key.strip():
                raise MalformedMultipartError(
                    f"a part header line is not 'Name: value' ({quoted(line)})"
                )
            name = key.strip().lower()
            headers[name] = value.strip()
        if len(self.parts) >= MAX_PARTS:
            raise MalformedMultipartError(f"more than {MAX_PARTS} parts in one request")
        if self.parts:
            self._budget.ended(self.parts[-1].file.tell(), self._limit)
        self._limit = self._budget.next_limit()
        # closed by close(), when the request is done with its parts
        spool = tempfile.SpooledTemporaryFile(max_size=self._limit)  # noqa: SIM115
        self.parts.append(Part(headers, spool))
        self._buffer = buffer[end + skip :]
        self._state = _BODY
        return True

    def _body(self) -> bool:
        buffer, delimiter = self._buffer, self._delimiter
        target = self.parts[-1].file
        start = 0
        while True:
            at = buffer.find(delimiter, start)
            if at < 0:
                break
            after = self._after_delimiter(at + len(delimiter))
            if after is None:  # the delimiter line continues in the next chunk
                target.write(buffer[:at])
                self._buffer = buffer[at:]
                return False
            if after == _NOT_A_DELIMITER:  # e.g. --boundaryXYZ: part of the data
                start = at + 1
                continue
            target.write(buffer[:at])
            if after == _CLOSE:
                self._state = _EPILOGUE
                self._buffer = b""
            else:
                self._begin_part(after)
            return True
        keep = max(0, len(buffer) - len(delimiter) + 1)
        target.write(buffer[:keep])
        self._buffer = buffer[keep:]
        return False

    # --- helpers ---------------------------------------------------------------------
    def _after_delimiter(self, at: int) -> int | None:
        """Where the next part's headers start after a delimiter ending before ``at``;
        _CLOSE for a close delimiter, _NOT_A_DELIMITER when the line goes on with other
        characters, None when the buffer ends too soon to tell."""
        buffer = self._buffer
        if buffer[at : at + 2] == b"--":
            return _CLOSE
        if len(buffer) < at + 2 and b"--".startswith(buffer[at:]):
            return None
        i = at
        while i < len(buffer) and buffer[i] in _LWSP:  # transport padding
            i += 1
            if i - at > MAX_PART_HEADERS:
                raise MalformedMultipartError("transport padding after a delimiter never ends")
        if buffer[i : i + 2] == b"\r\n":
            return i + 2
        if buffer[i : i + 1] == b"\n":
            return i + 1
        if i >= len(buffer) or buffer[i:] == b"\r":
            return None
        return _NOT_A_DELIMITER

    def _begin_part(self, headers_at: int) -> None:
        self._buffer = self._buffer[headers_at:]
        self._state = _HEADERS

    def _keep(self, at: int) -> None:
        """Drop the preamble before a delimiter at ``at``, keeping the byte before it
        (whether the delimiter starts a line is told by that byte)."""
        cut = max(0, at - 1)
        self._seen += cut
        self._buffer = self._buffer[cut:]


_CLOSE = -1
_NOT_A_DELIMITER = -2


def _blank_line(buffer: bytes) -> tuple[int, int]:
    """(end of the header block, length of the blank line's ending), or (-1, 0). An
    empty header block (a part with no headers) ends at once.

    Searched within the first :data:`MAX_PART_HEADERS` bytes, and for an LF-only blank
    line only before the CRLF one: each search ran to the end of the buffer (a CRLF body
    has no ``\\n\\n``), so every part of a chunk scanned the rest of the chunk, and
    99,999 empty parts took seconds of CPU to split."""
    for ending in (b"\r\n", b"\n"):
        if buffer.startswith(ending):
            return 0, len(ending)
    crlf = buffer.find(b"\r\n\r\n", 0, MAX_PART_HEADERS + 4)
    lf = buffer.find(b"\n\n", 0, crlf + 2 if crlf >= 0 else MAX_PART_HEADERS + 2)
    found = [(i, 4) for i in (crlf,) if i >= 0] + [(i, 2) for i in (lf,) if i >= 0]
    if not found:
        return -1, 0
    end, skip = min(found)
    return end, skip


def related_boundary(content_type: str | None, *, root_types: Sequence[str]) -> tuple[str, str]:
    """(boundary, root type) of a ``multipart/related`` Content-Type whose ``type``
    parameter is one of ``root_types`` (or absent: the first of them).

    Raises :class:`UnsupportedMediaError` (415) for another media type or root type, and
    :class:`MalformedMultipartError` (400) for a missing boundary or a parameter given
    twice (which boundary frames the body? before, the body check read the first and the
    parser the last, each answering with the other's fault)."""
    media = MediaType.parse(content_type or "")
    if media.repeated:
        raise MalformedMultipartError(
            f"the Content-Type gives {quoted(media.repeated[0])} twice: give each parameter "
            "(boundary, type) once"
        )
    if media.type != "multipart/related":
        raise UnsupportedMediaError(
            f"Content-Type {quoted(media.type)} is not supported; send "
            f'multipart/related; type="{root_types[0]}" with one DICOM instance per part'
        )
    root = media.params.get("type", root_types[0]).lower()
    if root not in root_types:
        raise UnsupportedMediaError(
            f"multipart/related of type {quoted(root)} is not supported; radserve stores "
            f"{', '.join(root_types)} parts (DICOM Part-10 files)"
        )
    boundary = media.params.get("boundary", "")
    if not boundary:
        raise MalformedMultipartError("the multipart/related Content-Type has no boundary")
    return boundary, root


@contextlib.asynccontextmanager
async def read_related(body: AsyncIterable[bytes], boundary: str) -> AsyncIterator[list[Part]]:
    """The parts of a request body (its chunks, e.g. Starlette's ``request.stream()``);
    their temporary files close on exit. Parsing runs on worker threads."""
    parser = RelatedParser(boundary)
    try:
        async for chunk in body:
            if chunk and not parser.complete:
                await to_thread.run_sync(parser.feed, chunk)
        parser.finish()
        if not parser.parts:
            raise MalformedMultipartError("the multipart/related body holds no part")
        yield parser.parts
    finally:
        parser.close()


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
    "Part",
    "RelatedParser",
    "new_boundary",
    "read_related",
    "related_boundary",
    "related_parts",
]
