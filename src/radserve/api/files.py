"""File answers (label maps, key images, the CT, result downloads, the console's page
and assets) and their Range header.

Starlette's ``FileResponse`` serves byte ranges, but its parser is lax where RFC 9110
is strict and strict where it is lax: ``bytes=--1`` was read as the last -1 bytes, i.e.
from byte size + 1, and answered **416**; ``bytes=+1-2``, ``bytes=1_0-20`` and non-ASCII
digits were served as ranges; ``items=0-1``, ``bytes=abc`` and ``bytes=5-2`` were
answered with a text/plain **400**. RFC 9110 14.2: a server MUST ignore a Range header
with a range unit it does not understand, and one that is not a valid ``ranges-specifier``
(a recipient "MAY ignore" an invalid one; a 4xx failed downloads that a plain GET serves);
416 is only for a valid range set of which no range is satisfiable (14.1.1: a first-pos
at or past the end, a suffix-length of 0). :func:`parse_range` is that grammar, and every
file route answers through :class:`FileAnswer` (the console's assets through
:class:`StaticFileAnswers`): an invalid header is ignored (200, the whole file), a valid
one is served (206), an unsatisfiable one answers 416 with ``Content-Range: bytes */size``.
"""

from __future__ import annotations

import os
import re
from os import PathLike
from typing import Any

from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers
from starlette.responses import RangeNotSatisfiable, Response
from starlette.staticfiles import NotModifiedResponse
from starlette.types import Scope

# the statuses a file route may answer beyond 200, for its OpenAPI ``responses``
RANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    206: {"description": "the requested byte range(s) (a Range header was sent)"},
    416: {"description": "the Range header asks for bytes past the end of the file"},
}

# RFC 9110 14.1.1: int-range = first-pos "-" [ last-pos ]; suffix-range = "-" suffix-length;
# positions are 1*DIGIT (ASCII digits only: Python's int() also takes "+1", "1_0", " 1",
# and other scripts' digits)
_RANGE_SPEC = re.compile(r"([0-9]+)-([0-9]*)|-([0-9]+)")
# the range unit is a token (RFC 9110 5.6.2); "=" follows it at once
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_OWS = " \t"
# a position of more digits is past any file's end (and int() refuses over 4300 digits)
_BEYOND = 10**18


def _position(digits: str) -> int:
    return int(digits) if len(digits) < 18 else _BEYOND


class InvalidRange(ValueError):
    """The Range header is no valid ``bytes`` ranges-specifier: it is to be ignored."""


def parse_range(header: str, size: int) -> list[tuple[int, int]]:
    """The byte ranges (start, end exclusive) of ``header`` for a file of ``size`` bytes,
    the satisfiable ones only, in the order given. :class:`InvalidRange` when the header
    is not a valid ``bytes`` ranges-specifier (another unit, a malformed or reversed
    range: ignore it and send the whole file); :class:`RangeNotSatisfiable` when it is
    valid and no range in it is satisfiable (416)."""
    unit, sep, range_set = header.partition("=")
    if not sep or not _TOKEN.fullmatch(unit):
        raise InvalidRange("no range unit")
    if unit.lower() != "bytes":
        raise InvalidRange(f"range unit {unit!r} is not bytes")
    specs = []
    for element in range_set.split(","):
        element = element.strip(_OWS)
        if not element:
            continue  # an empty list element (RFC 9110 5.6.1): allowed, means nothing
        match = _RANGE_SPEC.fullmatch(element)
        if match is None:
            raise InvalidRange(f"{element!r} is no byte range")
        first, last, suffix = match.groups()
        if suffix is not None:
            specs.append((None, _position(suffix)))
            continue
        if last and _position(last) < _position(first):
            raise InvalidRange(f"{element!r}: its last position is before its first")
        specs.append((_position(first), _position(last) if last else None))
    if not specs:
        raise InvalidRange("no byte range")
    ranges = []
    for first, last_or_length in specs:
        if first is None:  # a suffix: the last N bytes
            if last_or_length and size:
                ranges.append((max(size - last_or_length, 0), size))
        elif first < size:
            end = size if last_or_length is None else min(last_or_length + 1, size)
            ranges.append((first, end))
    if not ranges:
        raise RangeNotSatisfiable(size)
    return ranges


class FileAnswer(FileResponse):
    """A ``FileResponse`` whose Range header is read by :func:`parse_range`."""

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            ranges = parse_range(http_range, file_size)
        except InvalidRange:
            return []  # no ranges: Starlette sends the whole file with 200
        if len(ranges) > cls.max_ranges:
            return []  # as Starlette does: too many ranges get the whole file
        if len(ranges) == 1:
            return ranges
        # overlapping and adjacent ranges merged, as Starlette's parser did
        ranges.sort()
        merged = [ranges[0]]
        for start, end in ranges[1:]:
            last_start, last_end = merged[-1]
            if start <= last_end:
                merged[-1] = (last_start, max(last_end, end))
            else:
                merged.append((start, end))
        return merged


class StaticFileAnswers(StaticFiles):
    """``StaticFiles`` answering with :class:`FileAnswer` (the console's assets)."""

    def file_response(
        self,
        full_path: PathLike[str] | str,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = FileAnswer(full_path, status_code=status_code, stat_result=stat_result)
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            return NotModifiedResponse(response.headers)
        return response


__all__ = [
    "RANGE_RESPONSES",
    "FileAnswer",
    "InvalidRange",
    "StaticFileAnswers",
    "parse_range",
]
