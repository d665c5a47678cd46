"""A gzip writer for label maps that does not compress their empty stretches.

A label map on a 512 x 512 x 300 grid is 75 MiB of mostly zeros (air, everything
outside the organs, every slice without a finding); zlib at level 1 still reads every
byte of them (0.11 CPU-s for an all-zero findings map, 0.13 for an organ map, on the
report stage's worker threads). Here each write is cut into blocks; a run of all-zero
blocks is not compressed but spliced in as the deflate bytes of one zero block,
compressed once, repeated. The result is one ordinary gzip member (RFC 1952) that
every gzip reader decodes to exactly the bytes written:

- before each spliced run the stream is ended with a full flush (``Z_FULL_FLUSH``):
  byte-aligned, and nothing after it refers back past it;
- the spliced block was compressed by a fresh compressor and ends with a full flush
  too, so it refers to nothing before itself and leaves the stream aligned;
- the CRC-32 and length in the trailer cover every byte written, zeros included.

The header's modification time is 0 (RFC 1952: "no time stamp"): the same label map
gives the same file.
"""

from __future__ import annotations

import io
import struct
import zlib
from types import TracebackType
from typing import IO

import numpy as np

__all__ = ["SparseGzipWriter"]

BLOCK = 1 << 14
"""Bytes per block tested for zeros: 32 rows of a 512-column uint8 slice."""

LEVEL = 1
"""zlib level of the blocks that are compressed: nibabel's own default for .nii.gz."""

_HEADER = b"\x1f\x8b\x08\x00" + struct.pack("<I", 0) + b"\x04\xff"  # fastest, OS unknown


def _zero_block() -> bytes:
    """Deflate bytes of one block of zeros, self-contained and byte-aligned."""
    fresh = zlib.compressobj(LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return fresh.compress(bytes(BLOCK)) + fresh.flush(zlib.Z_FULL_FLUSH)


_ZERO_BLOCK = _zero_block()


class SparseGzipWriter(io.IOBase):
    """A write-only binary file that gzip-compresses what is written into ``file``.

    ``write`` accepts bytes-like objects; ``tell`` is the count of bytes written (what
    a reader will decompress), and ``seek`` moves forward only, by writing zeros, which
    is how nibabel reaches a header's data offset. ``close`` ends the gzip member but
    leaves ``file`` open: its owner (:func:`radserve.durable.write_with`, which writes a
    temporary and renames it only when whole) decides what becomes of it. A block that
    raises ends the stream without its trailer.
    """

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._closed = False
        self._file.write(_HEADER)
        self._deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._crc = 0
        self._size = 0
        self._pending = bytearray()  # less than a block, waiting for the next write

    # -- the file protocol nibabel uses --------------------------------------------
    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        n = view.nbytes
        self._crc = zlib.crc32(view, self._crc)
        self._size += n
        if self._pending:
            take = min(n, BLOCK - len(self._pending))
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < BLOCK:
                return n
            self._blocks(memoryview(bytes(self._pending)))
            self._pending.clear()
        whole = view.nbytes - view.nbytes % BLOCK
        if whole:
            self._blocks(view[:whole])
        self._pending += view[whole:]
        return n

    def tell(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = 0) -> int:  # type: ignore[override]
        if whence != 0 or offset < self._size:
            raise OSError("SparseGzipWriter only moves forward")
        self.write(bytes(offset - self._size))
        return self._size

    def flush(self) -> None:
        """Nothing to do before close: blocks go out as they fill (nibabel calls this)."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tail = self._deflate.compress(bytes(self._pending)) + self._deflate.flush()
        self._file.write(tail)
        self._file.write(struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self._closed

    def __enter__(self) -> SparseGzipWriter:
        return self

    def __exit__(  # type: ignore[override]
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        self._closed = True  # no trailer: what was written never reads as a whole member

    # -- the work --------------------------------------------------------------------
    def _blocks(self, view: memoryview) -> None:
        """Whole blocks: runs of non-zero blocks compressed, runs of zero blocks spliced."""
        flags = np.frombuffer(view, np.uint8).reshape(-1, BLOCK).any(axis=1)
        edges = np.flatnonzero(np.diff(flags.astype(np.int8))) + 1
        start = 0
        for stop in [*edges.tolist(), len(flags)]:
            if flags[start]:
                self._file.write(self._deflate.compress(view[start * BLOCK : stop * BLOCK]))
            else:
                self._file.write(self._deflate.flush(zlib.Z_FULL_FLUSH))
                self._file.write(_ZERO_BLOCK * (stop - start))
            start = stop
