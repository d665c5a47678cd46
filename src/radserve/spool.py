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
"""

from __future__ import annotations

PART_MEMORY_BYTES = 1 << 20  # one part in memory at most (Starlette's and ours before)
REQUEST_MEMORY_BYTES = 64 << 20  # all of one request's parts in memory at most


class SpoolBudget:
    """The ``max_size`` of each next part's ``SpooledTemporaryFile`` for one request."""

    def __init__(
        self, total: int = REQUEST_MEMORY_BYTES, per_part: int = PART_MEMORY_BYTES
    ) -> None:
        self.total = total
        self.per_part = per_part
        self.held = 0  # bytes of ended parts that stayed in memory

    def next_limit(self) -> int:
        """At least 1: ``max_size=0`` would mean "never roll over" (tempfile's rule)."""
        return max(1, min(self.per_part, self.total - self.held))

    def ended(self, size: int, limit: int) -> None:
        """A part of ``size`` bytes spooled under ``limit`` ended (in memory if it fit)."""
        if size <= limit:
            self.held += size


__all__ = ["PART_MEMORY_BYTES", "REQUEST_MEMORY_BYTES", "SpoolBudget"]
