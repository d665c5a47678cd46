"""What a compressed frame says of itself, read before any decoder sees it.

A JPEG, JPEG-LS or JPEG 2000 frame carries its own image description (rows, columns,
components, precision) in its frame header (SOF / SOF55) or SIZ marker, and the decoders
trust it, not the DICOM header: a 1 KB JPEG 2000 frame declaring 16384 x 16384 pixels in
a 40 x 40 slice took a decoding process up by 2.2 GB before it failed; a JPEG-LS frame
declaring fewer pixels than Rows x Columns made GDCM throw a C++ exception nobody
catches, which aborted the whole server (SIGABRT; the job resumed at the next start and
aborted it again); one declaring more, or the same count in another shape, was cut or
re-read to Rows x Columns and the study ran on pixels that are not the image
(2026-12-07 probe). An RLE frame has no image description, only its segment count,
which must match Samples per Pixel and Bits Allocated. A JPEG or JPEG-LS header is also
walked segment by segment up to its scan, and what GDCM ended its process on is refused
there (bytes between segments, a JFIF segment of another version, a second frame
header, JPEG-LS preset parameters out of bounds: tests/fuzz/codestream.py, 2026-12-08).

:func:`frame_problem` reads the description of one frame (a few dozen bytes, by seeking
over the marker segments around it; the frame may span several fragments) and compares
it with the header's Rows, Columns, Samples per Pixel and Bits Allocated. It is called
by the header reader (:mod:`radserve.ingest.headers`) for every frame of every
encapsulated instance, so every door (the upload form, STOW-RS, C-STORE, ``radserve
run``) refuses such a file, naming it, before anything is decoded.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass

from pydicom.uid import (
    HTJ2K,
    JPEG2000,
    JPEG2000MC,
    HTJ2KLossless,
    HTJ2KLosslessRPCL,
    JPEG2000Lossless,
    JPEG2000MCLossless,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    JPEGLossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)

Read = Callable[[int, int], bytes]
"""``read(position, size)``: up to ``size`` bytes of the frame from ``position``."""

_JPEG = frozenset({JPEGBaseline8Bit, JPEGExtended12Bit, JPEGLossless, JPEGLosslessSV1})
_JPEG_LS = frozenset({JPEGLSLossless, JPEGLSNearLossless})
_J2K = frozenset(
    {JPEG2000Lossless, JPEG2000, JPEG2000MCLossless, JPEG2000MC, HTJ2KLossless, HTJ2KLosslessRPCL}
) | {HTJ2K}

JUDGED_SYNTAXES = _JPEG | _JPEG_LS | _J2K | {RLELossless}
"""The encapsulated transfer syntaxes whose frames :func:`frame_problem` reads."""

# the start of frame markers (ITU T.81 B.1.1.3; 0xF7 is JPEG-LS's SOF55, T.87)
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_SOF55 = 0xF7
_LSE = 0xF8  # JPEG-LS preset parameters (T.87 C.2.4.1)
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: no length follows
_MAX_SEGMENTS = 1024  # marker segments before the frame header (tables, APPn)
_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
_MAX_BOXES = 64
_SOC_SIZ = b"\xff\x4f\xff\x51"


class Damaged(ValueError):
    """The frame does not start as its transfer syntax's codestream does."""


@dataclass(frozen=True)
class Declared:
    """The image a frame's codestream declares."""

    codec: str
    rows: int
    columns: int
    components: int
    precision: int


def start_markers(syntax: str) -> tuple[bytes, ...]:
    """What a frame of ``syntax`` may start with (a JPEG 2000 frame: a codestream or a
    JP2 file); none for a syntax without a start marker (RLE) or not judged here."""
    if syntax in _JPEG or syntax in _JPEG_LS:
        return (b"\xff\xd8",)
    if syntax in _J2K:
        return (_SOC_SIZ, _JP2_SIGNATURE)
    return ()


def frame_problem(
    syntax: str,
    read: Read,
    length: int,
    *,
    rows: int,
    columns: int,
    samples_per_pixel: int,
    bits_allocated: int,
) -> tuple[str, str] | None:
    """Why the frame (``length`` bytes, read through ``read``) is not the image the
    DICOM header describes, as ``(error code, text)``: ``instance_invalid`` when its
    codestream declares another image, ``decode_failed`` when it is not a codestream of
    its transfer syntax at all; None when it agrees (or the syntax is not judged)."""
    try:
        if syntax == RLELossless:
            return _rle_problem(read, length, samples_per_pixel, bits_allocated)
        declared = _declared(syntax, read, length)
    except Damaged as exc:
        return "decode_failed", str(exc)
    if declared is None:
        return None
    if (declared.rows, declared.columns, declared.components) == (
        rows,
        columns,
        samples_per_pixel,
    ) and declared.precision <= bits_allocated:
        return None
    return (
        "instance_invalid",
        f"its {declared.codec} codestream declares {declared.rows} × {declared.columns} "
        f"pixels of {declared.components} component(s) at {declared.precision} bits, but "
        f"Rows × Columns × Samples per Pixel say {rows} × {columns} × {samples_per_pixel} "
        f"at Bits Allocated {bits_allocated}: the pixel data is not the image the header "
        "describes",
    )


def _declared(syntax: str, read: Read, length: int) -> Declared | None:
    if syntax in _JPEG or syntax in _JPEG_LS:
        return _jpeg(read, length, "JPEG-LS" if syntax in _JPEG_LS else "JPEG")
    if syntax in _J2K:
        return _j2k(read, length)
    return None


def _jpeg(read: Read, length: int, codec: str) -> Declared:
    """The frame header of a JPEG or JPEG-LS codestream, once every marker segment from
    SOI to the first scan (SOS) has been walked by its length.

    The walk refuses what made GDCM end the process (2026-12-08, tests/fuzz/codestream.py)
    rather than fail the frame: bytes between two segments (libjpeg's "extraneous bytes
    before marker" warning) and a JFIF APP0 segment of another major version ("unknown
    JFIF revision") -- any libjpeg warning while GDCM reads the header is an assertion
    that throws a C++ exception nobody catches (SIGABRT); a second frame header (GDCM's
    JPEG-LS codec read past its buffer on one declaring 0 columns: SIGSEGV); and JPEG-LS
    preset coding parameters (LSE) outside ISO 14495-1 C.2.4.1.1 (MAXVAL 65534 at 7-bit
    precision ran GDCM's CharLS for ever, or not, depending on memory it had not set)."""
    if read(0, 2) != b"\xff\xd8":
        raise Damaged(f"it does not start a {codec} codestream (no SOI marker)")
    position = 2
    declared: Declared | None = None
    preset: tuple[int, ...] | None = None
    for _ in range(_MAX_SEGMENTS):
        head = read(position, 2)
        if len(head) < 2 or head[0] != 0xFF:
            if declared is None:
                raise Damaged(f"its {codec} codestream has no frame header (SOF) before it ends")
            raise Damaged(
                f"its {codec} codestream has bytes that are no marker segment before its scan"
            )
        marker = head[1]
        position += 2
        if marker == 0xFF:  # a fill byte before the marker
            position -= 1
            continue
        if marker in _STANDALONE or marker == 0xD8:
            continue
        if marker == 0x00:  # a stuffed zero: no marker
            raise Damaged(
                f"its {codec} codestream has bytes that are no marker segment before its scan"
            )
        if marker in (0xDA, 0xD9) and declared is None:  # SOS, EOI
            raise Damaged(f"its {codec} codestream has no frame header (SOF) before its scan")
        if marker == 0xD9:
            raise Damaged(f"its {codec} codestream has no scan (SOS) after its frame header")
        size_bytes = read(position, 2)
        size = struct.unpack(">H", size_bytes)[0] if len(size_bytes) == 2 else 0
        if size < 2 or position + size > length:
            raise Damaged(f"its {codec} codestream has a damaged marker segment")
        if marker in _SOF or marker == _SOF55:
            if declared is not None:
                raise Damaged(f"its {codec} codestream has more than one frame header (SOF)")
            declared = _frame_header(read(position, 8), marker, codec)
        elif marker == 0xDA and declared is not None:
            if declared.codec == "JPEG-LS":
                near = _near(read(position, size))
                _check_preset(preset or (0, 0, 0, 0, 0), declared.precision, near)
            return declared
        elif marker == 0xE0:
            _check_jfif(read(position, min(size, 9)))
        elif marker == _LSE:
            lse = read(position, size)
            if len(lse) >= 3 and lse[2] == 1:  # preset coding parameters
                if size != 13 or len(lse) < 13:
                    raise Damaged("its JPEG-LS preset parameters segment (LSE) is damaged")
                preset = struct.unpack(">5H", lse[3:13])
        position += size
    raise Damaged(
        f"its {codec} codestream has no frame header in its first {_MAX_SEGMENTS} segments"
    )


def _frame_header(segment: bytes, marker: int, codec: str) -> Declared:
    if len(segment) < 8:
        raise Damaged(f"its {codec} frame header is cut short")
    size, precision, height, width, components = struct.unpack(">HBHHB", segment)
    found = "JPEG-LS" if marker == _SOF55 else "JPEG"
    if size != 8 + 3 * components or not 2 <= precision <= 16 or components < 1:
        raise Damaged(f"its {found} frame header is damaged")
    return Declared(found, height, width, components, precision)


def _check_jfif(segment: bytes) -> None:
    """libjpeg warns of a JFIF APP0 segment (14 bytes or more) whose major version is
    not 1, and GDCM ends the process on that warning."""
    (size,) = struct.unpack(">H", segment[:2])
    if size >= 16 and segment[2:7] == b"JFIF\x00" and len(segment) > 7 and segment[7] != 1:
        raise Damaged(
            f"its JFIF segment gives version {segment[7]}.{segment[8] if len(segment) > 8 else 0}"
            ", and JFIF has only version 1"
        )


def _near(sos: bytes) -> int:
    """NEAR of a JPEG-LS scan header (ISO 14495-1 C.2.3: Ls, Ns, Ns x (Ci, Tmi), NEAR)."""
    if len(sos) < 3 or len(sos) != 6 + 2 * sos[2]:
        raise Damaged("its JPEG-LS scan header (SOS) is damaged")
    return sos[3 + 2 * sos[2]]


def _check_preset(preset: tuple[int, ...], precision: int, near: int) -> None:
    """JPEG-LS preset coding parameters as ISO 14495-1 C.2.4.1.1 bounds them (0: the
    default), the checks CharLS 2 makes and the CharLS inside GDCM does not."""
    maxval, t1, t2, t3, reset = preset
    top = (1 << precision) - 1
    value = maxval or top
    default = _default_thresholds(value, near) if value <= top else (0, 0, 0)
    low1 = t1 or default[0]
    low2 = t2 or default[1]
    if (
        maxval > top
        or near > value // 2
        or (t1 and not near + 1 <= t1 <= value)
        or (t2 and not low1 <= t2 <= value)
        or (t3 and not low2 <= t3 <= value)
        or (reset and not 3 <= reset <= max(255, value))
    ):
        raise Damaged(
            f"its JPEG-LS preset coding parameters (MAXVAL {maxval}, T1 {t1}, T2 {t2}, "
            f"T3 {t3}, RESET {reset}) are out of bounds for {precision}-bit samples "
            f"and NEAR {near}"
        )


def _default_thresholds(maxval: int, near: int) -> tuple[int, int, int]:
    """T1, T2, T3 when the LSE segment gives 0 (ISO 14495-1 C.2.4.1.1.1)."""

    def clamp(value: int, low: int) -> int:
        return low if value > maxval or value < low else value

    if maxval >= 128:
        factor = (min(maxval, 4095) + 128) // 256
        t1 = clamp(factor * (3 - 2) + 2 + 3 * near, near + 1)
        t2 = clamp(factor * (7 - 3) + 3 + 5 * near, t1)
        return t1, t2, clamp(factor * (21 - 4) + 4 + 7 * near, t2)
    factor = 256 // (maxval + 1)
    t1 = clamp(max(2, 3 // factor + 3 * near), near + 1)
    t2 = clamp(max(3, 7 // factor + 5 * near), t1)
    return t1, t2, clamp(max(4, 21 // factor + 7 * near), t2)


def _j2k(read: Read, length: int) -> Declared:
    """The SIZ marker segment, which follows SOC at once (ISO 15444-1 A.5.1); in a JP2
    file, that of the contiguous codestream box ``jp2c``."""
    start = _codestream_start(read, length)
    siz = read(start, 4 + 38)
    if len(siz) < 42 or siz[:4] != _SOC_SIZ:
        raise Damaged("it does not start a JPEG 2000 codestream (no SOC and SIZ markers)")
    (size,) = struct.unpack(">H", siz[4:6])
    x, y, x0, y0 = struct.unpack(">IIII", siz[8:24])
    (count,) = struct.unpack(">H", siz[40:42])
    sizes = read(start + 42, 3 * min(count, 4))
    if (
        not 1 <= count <= 16384
        or size != 38 + 3 * count
        or len(sizes) < 3 * min(count, 4)
        or x0 >= x
        or y0 >= y
    ):
        raise Damaged("its JPEG 2000 SIZ marker segment is damaged")
    precision = max((sizes[i] & 0x7F) + 1 for i in range(0, len(sizes), 3))
    if precision > 38:  # ISO 15444-1 A.5.1: Ssiz is 1 to 38 bits
        raise Damaged("its JPEG 2000 SIZ marker segment is damaged")
    return Declared("JPEG 2000", y - y0, x - x0, count, precision)


def _codestream_start(read: Read, length: int) -> int:
    if read(0, 4) == _SOC_SIZ:
        return 0
    if read(0, len(_JP2_SIGNATURE)) != _JP2_SIGNATURE:
        raise Damaged("it does not start a JPEG 2000 codestream (no SOC marker) or JP2 file")
    position = 0
    for _ in range(_MAX_BOXES):
        head = read(position, 16)
        if len(head) < 8:
            break
        size, kind = struct.unpack(">I4s", head[:8])
        header = 8
        if size == 1 and len(head) == 16:
            (size,) = struct.unpack(">Q", head[8:16])
            header = 16
        if kind == b"jp2c":
            return position + header
        if size == 0 or size < header:
            break
        position += size
        if position >= length:
            break
    raise Damaged("its JP2 file holds no codestream box (jp2c)")


def _rle_problem(
    read: Read, length: int, samples_per_pixel: int, bits_allocated: int
) -> tuple[str, str] | None:
    """The RLE header (PS3.5 G.3.1): 16 little-endian integers, the segment count and
    each segment's offset. One segment per byte of each sample is due."""
    header = read(0, 64)
    if len(header) < 64:
        return "decode_failed", "it is shorter than an RLE header (64 bytes)"
    count, *offsets = struct.unpack("<16L", header)
    expected = samples_per_pixel * max(1, bits_allocated // 8)
    if not 1 <= count <= 15 or offsets[0] != 64:
        return "decode_failed", "its RLE header is damaged (segment count or first offset)"
    used = offsets[:count]
    if any(b <= a for a, b in itertools.pairwise(used)) or used[-1] >= length:
        return (
            "decode_failed",
            "its RLE header's segment offsets are not ascending within the frame",
        )
    if count != expected:
        return (
            "instance_invalid",
            f"its RLE header lists {count} segments, but Samples per Pixel × Bits Allocated "
            f"/ 8 say {expected}: the pixel data is not the image the header describes",
        )
    return None


__all__ = ["JUDGED_SYNTAXES", "Damaged", "Declared", "frame_problem", "start_markers"]
