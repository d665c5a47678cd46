"""Encapsulated Pixel Data checked before a decoder reads it: its fragments, its offset
tables and each frame's own codestream header.

The header reader (:mod:`radserve.ingest.headers`) calls :func:`encapsulated_problem` for
every encapsulated instance at every door. It walks the fragments (seeking over their
values), and checks what a decoder will trust: the Basic Offset Table and the Extended
Offset Table must point at fragments, in ascending order (PS3.5 A.4; with an Extended
Offset Table every frame in one fragment of the length it gives), and each frame's
codestream must declare the image the header describes (:mod:`radserve.ingest.codestream`).
Before 2026-12-07 only the tables' entry counts were checked: an Extended Offset Table
whose first two entries were swapped ran, the two slices swapped; tables pointing into a
fragment failed at decode with "the file is damaged, or no installed decoder supports it".
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from pydicom.dataset import Dataset

from radserve.ingest import codestream
from radserve.ingest.sources import BoundedStream

MAX_FRAGMENTS = 1_000_000  # encapsulated fragments walked per file

Found = tuple[str, str] | None
"""What is wrong, as ``(error code, text)``, or None."""


@dataclass(frozen=True)
class Image:
    """What the DICOM header says each frame holds."""

    syntax: str  # the transfer syntax UID
    rows: int
    columns: int
    samples_per_pixel: int
    bits_allocated: int


def encapsulated_problem(
    ds: Dataset,
    fh: BoundedStream,
    endian: str,
    size: int,
    n_frames: int,
    image: Image,
    *,
    max_after: int,
) -> Found:
    """Whether encapsulated Pixel Data (``fh`` just after its element header) holds
    ``n_frames`` frames that a decoder can find and read as the ``image`` the header
    describes: its items and delimiter within the file's ``size`` bytes (and at most
    ``max_after`` bytes after them), its offset tables pointing at its fragments in
    order, and each frame's codestream declaring that image
    (:func:`codestream.frame_problem`). ``(code, text)`` or None."""
    item = struct.pack(endian + "HH", 0xFFFE, 0xE000)
    delimiter = struct.pack(endian + "HH", 0xFFFE, 0xE0DD)
    head = fh.read(8)
    if len(head) < 8 or head[:4] != item:
        return ("decode_failed", "encapsulated Pixel Data has no Basic Offset Table item")
    (table,) = struct.unpack(endian + "L", head[4:])
    if table % 4 or fh.tell() + table > size:
        return ("decode_failed", "encapsulated Pixel Data has a damaged Basic Offset Table")
    if table and table // 4 != n_frames:
        return (
            "decode_failed",
            f"the Basic Offset Table lists {table // 4} frames, Number of Frames says {n_frames}",
        )
    extended = (
        ds.get_item("ExtendedOffsetTable", keep_deferred=True)
        if "ExtendedOffsetTable" in ds
        else None
    )
    if extended is not None and extended.length and extended.length // 8 != n_frames:
        return (
            "decode_failed",
            f"the Extended Offset Table lists {extended.length // 8} frames, Number of Frames "
            f"says {n_frames}",
        )
    basic = fh.read_at(fh.tell(), table) if table else b""
    first_item = fh.tell()
    fragments = _Fragments(first_item)
    while True:
        at = fh.tell()
        head = fh.read(8)
        if head[:4] == delimiter:
            break
        if len(head) < 8 or head[:4] != item:
            return (
                "decode_failed",
                "the file is truncated or damaged: encapsulated Pixel Data ends without its "
                f"sequence delimiter after {len(fragments)} fragments",
            )
        (length,) = struct.unpack(endian + "L", head[4:])
        if fh.tell() + length > size:
            return (
                "decode_failed",
                f"the file is truncated: fragment {len(fragments) + 1} of the Pixel Data runs "
                "past the end of the file",
            )
        fragments.add(at, length)
        fh.seek(length, 1)
        if len(fragments) > MAX_FRAGMENTS:
            return ("input_too_large", f"Pixel Data has more than {MAX_FRAGMENTS} fragments")
    if len(fragments) < n_frames:
        return (
            "decode_failed",
            f"encapsulated Pixel Data has {len(fragments)} fragments, too few for Number of "
            f"Frames {n_frames} (each frame needs at least one)",
        )
    if size - fh.tell() > max_after:
        return "input_too_large", after_text("Pixel Data", size - fh.tell(), max_after)
    return _frames_problem(ds, fh, n_frames, fragments, basic, endian, image)


def after_text(name: str, after: int, max_after: int) -> str:
    """Why a file holding ``after`` bytes after its pixel data (element ``name``) is
    refused."""
    return (
        f"{after} bytes follow the {name} element, more than "
        f"ingest.max_header_bytes={max_after}: what follows the pixel data is bounded as "
        "the header is"
    )


class _Fragments:
    """Where an encapsulated Pixel Data's fragments lie: each item's offset from the first
    fragment's item tag (what the offset tables count) and its value's length, in two
    compact arrays (up to :data:`MAX_FRAGMENTS`)."""

    def __init__(self, first_item: int) -> None:
        self.first_item = first_item
        self.offsets = array("q")
        self.lengths = array("q")

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, at: int, length: int) -> None:
        self.offsets.append(at - self.first_item)
        self.lengths.append(length)

    def value_at(self, k: int) -> int:
        """Where fragment ``k``'s value starts in the file."""
        return self.first_item + self.offsets[k] + 8

    def index_of(self, offset: int) -> int | None:
        """The fragment whose item starts ``offset`` bytes after the first one's."""
        k = bisect.bisect_left(self.offsets, offset)
        return k if k < len(self.offsets) and self.offsets[k] == offset else None


def _frames_problem(
    ds: Dataset,
    fh: BoundedStream,
    n_frames: int,
    fragments: _Fragments,
    basic: bytes,
    endian: str,
    image: Image,
) -> Found:
    """Whether the offset tables point at the fragments, and each frame's codestream
    declares the image the header describes (:func:`codestream.frame_problem`), before
    a decoder trusts either: an Extended Offset Table with two frames' entries swapped
    ran, its slices swapped; a JPEG 2000 frame declaring 16384 x 16384 pixels took a
    decoding process up by 2.2 GB; a JPEG-LS frame of fewer pixels than Rows x Columns
    aborted the server (2026-12-07)."""
    syntax = image.syntax
    firsts = _frame_firsts(ds, fh, syntax, n_frames, fragments, basic, endian)
    if isinstance(firsts, tuple) or firsts is None:
        return firsts
    if syntax not in codestream.JUDGED_SYNTAXES:
        return None
    ends = [*firsts[1:], len(fragments)]
    for i, (first, end) in enumerate(zip(firsts, ends, strict=True)):
        spans = [(fragments.value_at(k), fragments.lengths[k]) for k in range(first, end)]
        problem = codestream.frame_problem(
            syntax,
            partial(_read_spans, fh, spans),
            sum(length for _, length in spans),
            rows=image.rows,
            columns=image.columns,
            samples_per_pixel=image.samples_per_pixel,
            bits_allocated=image.bits_allocated,
        )
        if problem is not None:
            where = f"frame {i + 1} of {n_frames}: " if n_frames > 1 else ""
            return problem[0], where + problem[1]
    return None


def _frame_firsts(
    ds: Dataset,
    fh: BoundedStream,
    syntax: str,
    n_frames: int,
    fragments: _Fragments,
    basic: bytes,
    endian: str,
) -> list[int] | Found:
    """The index of each frame's first fragment, as a decoder will find it: from the
    Extended or Basic Offset Table (which must point at fragments, in order), one
    fragment per frame, or the fragments that start a codestream; None when that cannot
    be told (RLE in more fragments than frames, without a table)."""
    if ds.get("ExtendedOffsetTable"):
        return _extended_firsts(ds, fragments, n_frames)
    if basic:
        offsets = struct.unpack(f"{endian}{len(basic) // 4}L", basic)
        return _table_firsts("Basic Offset Table", offsets, fragments)
    if n_frames == 1:
        return [0]
    if len(fragments) == n_frames:
        return list(range(n_frames))
    markers = codestream.start_markers(syntax)
    if not markers:
        return None
    size = max(map(len, markers))
    firsts = [
        k
        for k in range(len(fragments))
        if fh.read_at(fragments.value_at(k), size).startswith(markers)
    ]
    if len(firsts) != n_frames or firsts[0] != 0:
        return (
            "decode_failed",
            f"encapsulated Pixel Data has {len(fragments)} fragments and no offset table, and "
            f"{len(firsts)} of them start a frame where Number of Frames says {n_frames}: "
            "which fragments make which frame cannot be told",
        )
    return firsts


def _extended_firsts(
    ds: Dataset, fragments: _Fragments, n_frames: int
) -> list[int] | tuple[str, str]:
    """The Extended Offset Table (PS3.3 C.7.6.3.1.8): each frame in one fragment, its
    offset and its length. A decoder reads each frame where the table says, as long as
    it says: entries swapped swapped the slices, silently."""
    offsets = struct.unpack(f"<{n_frames}Q", bytes(ds.ExtendedOffsetTable)[: 8 * n_frames])
    lengths_raw = bytes(ds.get("ExtendedOffsetTableLengths") or b"")
    if len(lengths_raw) < 8 * n_frames:
        return (
            "decode_failed",
            "an Extended Offset Table without Extended Offset Table Lengths for every frame",
        )
    firsts = _table_firsts("Extended Offset Table", offsets, fragments)
    if isinstance(firsts, tuple):
        return firsts
    lengths = struct.unpack(f"<{n_frames}Q", lengths_raw[: 8 * n_frames])
    for i, (first, length) in enumerate(zip(firsts, lengths, strict=True)):
        held = fragments.lengths[first]
        if not held - 1 <= length <= held:  # a frame's odd length is padded to even
            return (
                "decode_failed",
                f"the Extended Offset Table Lengths give frame {i + 1} {length} bytes, but "
                f"its fragment holds {held}: the table does not describe the fragments",
            )
    return firsts


def _table_firsts(
    name: str, offsets: Sequence[int], fragments: _Fragments
) -> list[int] | tuple[str, str]:
    firsts = []
    for i, offset in enumerate(offsets):
        k = fragments.index_of(offset)
        if k is None:
            return (
                "decode_failed",
                f"the {name}'s entry for frame {i + 1} points at no fragment (offset "
                f"{offset}): the table does not describe the fragments",
            )
        if (firsts and k <= firsts[-1]) or (not firsts and k != 0):
            return (
                "decode_failed",
                f"the {name}'s offsets do not ascend from the first fragment (frame {i + 1}): "
                "the frames would be read out of order",
            )
        firsts.append(k)
    return firsts


def _read_spans(fh: BoundedStream, spans: list[tuple[int, int]], position: int, size: int) -> bytes:
    """Up to ``size`` bytes from ``position`` of the bytes ``spans`` (where each of a
    frame's fragments' values starts, and its length) make together."""
    out = b""
    for start, length in spans:
        if position >= length:
            position -= length
            continue
        take = min(size - len(out), length - position)
        out += fh.read_at(start + position, take)
        position = 0
        if len(out) >= size:
            break
    return out


__all__ = ["MAX_FRAGMENTS", "Image", "after_text", "encapsulated_problem"]
