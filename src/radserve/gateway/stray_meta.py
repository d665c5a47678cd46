"""File Meta elements (group 0002) a sender put inside a C-STORE data set: removed.

Group 0002 belongs to a Part 10 file's File Meta Information, never to a data set sent
over the network (PS3.7 6.3.1: the transfer syntax is the presentation context's). Some
senders send a file's data set with its meta group still in it. pynetdicom writes each
received data set after a File Meta of its own (the context's transfer syntax), so such
elements follow it directly, and pydicom read them as part of the File Meta: a stray
Transfer Syntax UID of Explicit VR Big Endian was obeyed over the negotiated Explicit VR
Little Endian, the data set read byte-swapped, and the instance refused with "Study
Instance UID missing" (the stored file would have read the same way downstream).

:func:`remove_stray_meta` removes the group 0002 elements at the start of the data set
(where they sort) from the received file, read in the negotiated transfer syntax, so the
context's transfer syntax governs; the rest of the data set is kept byte for byte. A
Deflated data set is left as it is (its elements cannot be seen without inflating it;
its File Meta is the context's, and pydicom inflates only what follows that).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import BinaryIO

from pydicom.uid import UID

_PREAMBLE = 128
_META_START = _PREAMBLE + 4  # after "DICM"
# (0002,0000) UL, 4 bytes: Explicit VR Little Endian, the first element pynetdicom writes
_GROUP_LENGTH = b"\x02\x00\x00\x00UL\x04\x00"
_LONG_VRS = frozenset(
    b"OB OD OF OL OV OW SQ SV UC UN UR UT UV".split()  # 2 reserved bytes, 4-byte length
)
_UNDEFINED = 0xFFFFFFFF


def remove_stray_meta(
    path: Path, transfer_syntax: str, *, max_bytes: int, max_elements: int | None = None
) -> int:
    """Remove the group 0002 elements at the start of the data set of ``path`` (a file
    as pynetdicom writes a received C-STORE: preamble, its File Meta, the data set as
    received in ``transfer_syntax``); return how many were removed (0: the file is left
    as it is). At most ``max_bytes`` of such elements, and at most ``max_elements`` of
    them, are skipped (the header bounds, ``ingest.max_header_bytes`` and
    ``ingest.max_header_elements``, which the header read then applies); past either,
    or on one that cannot be skipped (an undefined length), the file is left as it is.
    (Without the element bound, 4,000,000 empty group 0002 elements, a 32 MB data set,
    took 7.9 CPU-s of a receiving process to skip, per instance.) Raises OSError when
    the file cannot be rewritten."""
    syntax = UID(transfer_syntax)
    try:
        if syntax.is_deflated:
            return 0
        implicit, little = syntax.is_implicit_VR, syntax.is_little_endian
    except ValueError:  # not a transfer syntax pydicom knows: not read here either
        return 0
    with open(path, "rb") as raw:
        head = raw.read(_META_START + len(_GROUP_LENGTH) + 4)
        if head[_PREAMBLE:_META_START] != b"DICM" or not head[_META_START:].startswith(
            _GROUP_LENGTH
        ):
            return 0
        meta_end = len(head) + int.from_bytes(head[-4:], "little")
        raw.seek(meta_end)
        count, end = _skip_group_0002(
            raw, implicit=implicit, little=little, limit=max_bytes, max_elements=max_elements
        )
    if not count:
        return 0
    _rewrite_without(path, meta_end, end)
    return count


def _skip_group_0002(
    raw: BinaryIO, *, implicit: bool, little: bool, limit: int, max_elements: int | None = None
) -> tuple[int, int]:
    """(how many group 0002 elements begin the data set at ``raw``'s position, the offset
    after them); (0, ...) when they cannot all be skipped within ``limit`` bytes and
    ``max_elements`` elements."""
    read = raw.read
    start = raw.tell()
    order = "<" if little else ">"
    count, at = 0, start
    while at - start <= limit:
        tag = read(4)
        if len(tag) < 4:
            break
        group = struct.unpack(f"{order}H", tag[:2])[0]
        if group != 0x0002:
            break
        if implicit:
            header = read(4)
            if len(header) < 4:
                return 0, start
            length = struct.unpack(f"{order}I", header)[0]
            size = 8
        else:
            vr = read(2)
            if len(vr) < 2:
                return 0, start
            if vr in _LONG_VRS:
                header = read(6)
                if len(header) < 6:
                    return 0, start
                length = struct.unpack(f"{order}I", header[2:])[0]
                size = 12
            else:
                header = read(2)
                if len(header) < 2:
                    return 0, start
                length = struct.unpack(f"{order}H", header)[0]
                size = 8
        if length == _UNDEFINED:
            return 0, start  # a sequence of File Meta: not skipped blindly
        at += size + length
        raw.seek(at)
        count += 1
        if max_elements is not None and count > max_elements:
            return 0, start  # past the header's element bound: the header read refuses it
    else:
        return 0, start  # past the header bound
    return count, at


def _rewrite_without(path: Path, cut_from: int, cut_to: int) -> None:
    """``path`` without the bytes ``cut_from:cut_to``, replaced atomically (a file
    beside it, renamed over it)."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=".stray-meta-", suffix=".dcm")
    try:
        with open(descriptor, "wb") as out, open(path, "rb") as source:
            out.write(source.read(cut_from))
            source.seek(cut_to)
            shutil.copyfileobj(source, out, 1024 * 1024)
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
