"""File answers (label maps, key images, the CT, result downloads) and their Range header.

Starlette's ``FileResponse`` serves byte ranges, but answers a Range header it cannot
parse (``items=0-1``, ``bytes=abc``, ``bytes=5-1``) with **400 text/plain**. RFC 9110
(14.2) says a server MUST ignore a Range header with a unit it does not understand and
MAY ignore an invalid one; the API's own rule is that every failure is a JSON error
body. An integrator's download manager that sends an odd Range then failed where a
plain GET works. :class:`FileAnswer` ignores such a header and sends the whole file
(200); a well-formed range is served as before (206), one past the end still gets 416.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import FileResponse
from starlette.responses import MalformedRangeHeader

# the statuses a file route may answer beyond 200, for its OpenAPI ``responses``
RANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    206: {"description": "the requested byte range(s) (a Range header was sent)"},
    416: {"description": "the Range header asks for bytes past the end of the file"},
}


class FileAnswer(FileResponse):
    """A ``FileResponse`` that ignores a Range header it cannot parse (RFC 9110 14.2)."""

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader:
            return []  # no ranges: Starlette sends the whole file with 200


__all__ = ["RANGE_RESPONSES", "FileAnswer"]
