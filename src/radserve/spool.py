"""How much of one request's uploaded parts stays in memory.

Both multipart readers (Starlette's form parser for ``POST /v1/studies``, radserve's
``multipart/related`` reader for STOW-RS) spooled each part in memory up to 1 MiB before
writing it to disk. DICOM slices are smaller than that (a 512 x 512 CT slice is 0.5 MiB),
so a whole study stayed in memory: 300 parts of 1 MiB - 1 byte raised the server's peak
RSS by 305 MB, and an upload up to ``server.max_upload_bytes`` (2 GiB) could hold that
much. A :class:`SpoolBudget` per request keeps parts in memory while the request's
in-memory total is under :data:`REQUEST_MEMORY_BYTES`; later parts go to disk from their
first byte (each then holds an open temporary file until the request ends: ``radserve
serve`` raises its open-file limit to the hard limit for that).

A part on disk holds an open file until the request ends, and a request may hold
100,000 parts: past the open-files limit the next part's file failed (EMFILE) and the
request was a 500 (or, worse, a database connection or a socket failed beside it). A
request may keep at most :func:`disk_parts_allowed` parts on disk, a quarter of the
limit (the rest for sockets, the store, models and other uploads); past it the request
is refused with a 413 that says so.
"""

from __future__ import annotations

import resource

from radserve.errors import RadserveError

PART_MEMORY_BYTES = 1 << 20  # one part in memory at most (Starlette's and ours before)
REQUEST_MEMORY_BYTES = 64 << 20  # all of one request's parts in memory at most


class TooManyPartsOnDiskError(RadserveError):
    """A request's parts past its in-memory budget would hold more open files than the
    server may give one request (413)."""

    code = "upload_too_large"


def disk_parts_allowed() -> int:
    """Parts on disk one request may hold: a quarter of the open-files soft limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (1 << 20) // 4 if soft == resource.RLIM_INFINITY else max(16, soft // 4)


class SpoolBudget:
    """The ``max_size`` of each next part's ``SpooledTemporaryFile`` for one request, and
    the bound on its parts on disk (each holds an open file until the request ends)."""

    def __init__(
        self,
        total: int = REQUEST_MEMORY_BYTES,
        per_part: int = PART_MEMORY_BYTES,
        on_disk_max: int | None = None,
    ) -> None:
        self.total = total
        self.per_part = per_part
        self.held = 0  # bytes of ended parts that stayed in memory
        self.on_disk = 0  # ended parts that went to disk
        self.on_disk_max = disk_parts_allowed() if on_disk_max is None else on_disk_max

    def next_limit(self) -> int:
        """At least 1: ``max_size=0`` would mean "never roll over" (tempfile's rule).
        Raises :class:`TooManyPartsOnDiskError` when no other part may go to disk."""
        if self.on_disk >= self.on_disk_max:
            raise TooManyPartsOnDiskError(
                f"the upload's parts past the first {self.total >> 20} MiB each hold an "
                f"open file, and one request may hold {self.on_disk_max} (a quarter of "
                "the server's open-files limit): send the study in several requests, or "
                "raise the server's limit (LimitNOFILE)"
            )
        return max(1, min(self.per_part, self.total - self.held))

    def ended(self, size: int, limit: int) -> None:
        """A part of ``size`` bytes spooled under ``limit`` ended (in memory if it fit)."""
        if size <= limit:
            self.held += size
        else:
            self.on_disk += 1


__all__ = [
    "PART_MEMORY_BYTES",
    "REQUEST_MEMORY_BYTES",
    "SpoolBudget",
    "TooManyPartsOnDiskError",
    "disk_parts_allowed",
]
