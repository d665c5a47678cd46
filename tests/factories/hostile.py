"""Hostile DICOM inputs: header mutations written as raw bytes (any VR, any value),
truncations and bombs, from a small valid series. Seeded and bounded, so a case number
always means the same input.

:func:`mutate` writes raw element values with :func:`set_raw`, so text lands in numeric
attributes exactly as a broken or hostile sender would write it (pydicom refuses to
encode such values itself). :func:`cases` yields ``count`` cases for a seed; each case
writes its files into a folder and names its class (``header``, ``geometry``, ``pixel``,
``truncation``, ``bomb``) so the suite can hold each class to its own bounds.
"""

from __future__ import annotations

import random
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pydicom
from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.tag import Tag
from pydicom.uid import DeflatedExplicitVRLittleEndian, EnhancedCTImageStorage

from tests.factories.dicom_series import make_ct_series, make_enhanced_series

BOMB_BYTES = 256 * 2**20
"""Size of the private element in the zip and deflate bombs (a few hundred KB packed)."""

# Values a broken or hostile sender writes, as text (string VRs) ...
TEXT_VALUES = (
    "",
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1e30",
    "1e4",
    "100",
    "nan",
    "NaN\\NaN",
    "inf",
    "-inf",
    "abc",
    "\\\\\\",
    "2147483647",
    "-2147483648",
    "1e9",
    "0.01\\10000",
    "1\\2\\3\\4\\5\\6\\7",
    "0\\0\\0\\0\\0\\0",
    "1\\0\\0\\1\\0\\0",
    "Doe^John",
    "x" * 5000,
)
# ... and as binary (US/SS/UL and other binary VRs)
BINARY_VALUES = (0, 1, 2, 3, 7, 12, 17, 33, 255, 32768, 65535)

ATTRIBUTES = (
    # pixel format and frame counts
    "NumberOfFrames",
    "Rows",
    "Columns",
    "BitsAllocated",
    "BitsStored",
    "HighBit",
    "PixelRepresentation",
    "SamplesPerPixel",
    "PhotometricInterpretation",
    "PlanarConfiguration",
    "PixelPaddingValue",
    "RescaleSlope",
    "RescaleIntercept",
    # geometry
    "PixelSpacing",
    "ImagePositionPatient",
    "ImageOrientationPatient",
    "SliceThickness",
    "SpacingBetweenSlices",
    # identity and what the outputs copy
    "SOPClassUID",
    "SOPInstanceUID",
    "SeriesInstanceUID",
    "StudyInstanceUID",
    "FrameOfReferenceUID",
    "PatientID",
    "PatientName",
    "PatientBirthDate",
    "StudyDate",
    "InstanceNumber",
    "ImageType",
    "Modality",
    "SpecificCharacterSet",
)
GEOMETRY = {
    "PixelSpacing",
    "ImagePositionPatient",
    "ImageOrientationPatient",
    "SliceThickness",
    "SpacingBetweenSlices",
}
PIXEL = {
    "NumberOfFrames",
    "Rows",
    "Columns",
    "BitsAllocated",
    "BitsStored",
    "HighBit",
    "PixelRepresentation",
    "SamplesPerPixel",
    "PhotometricInterpretation",
    "PlanarConfiguration",
    "PixelPaddingValue",
    "RescaleSlope",
    "RescaleIntercept",
}


@dataclass(frozen=True)
class Case:
    """One hostile input: ``write(folder)`` puts its files there."""

    number: int
    kind: str  # header | geometry | pixel | truncation | bomb
    name: str
    write: Callable[[Path], None]


def set_raw(ds: Dataset, keyword: str, value: bytes, vr: str | None = None) -> None:
    """Store ``value`` as the element's raw bytes, whatever its VR allows."""
    tag = Tag(tag_for_keyword(keyword))
    vr = vr or dictionary_VR(tag).split(" or ")[0]  # "US or SS": written as US
    if len(value) % 2:
        value += b"\0" if vr in ("OB", "UI") else b" "
    ds._dict[tag] = RawDataElement(tag, vr, len(value), value, 0, False, True)


def raw_value(keyword: str, rng: random.Random) -> bytes:
    """A hostile value for ``keyword``: text for string VRs, binary for the others
    (sometimes of the wrong length)."""
    vr = dictionary_VR(keyword).split(" or ")[0]
    if vr in ("US", "SS"):
        data = struct.pack("<H", rng.choice(BINARY_VALUES))
        return data + b"\x01" if rng.random() < 0.1 else data
    if vr in ("UL", "SL"):
        return struct.pack("<L", rng.choice((0, 1, 2**31 - 1, 2**32 - 1)))
    return rng.choice(TEXT_VALUES).encode("latin-1")


def base_series(folder: Path, seed: int) -> list[Path]:
    return make_ct_series(folder, n_slices=5, rows=16, cols=12, seed=seed)


def mutate(paths: list[Path], edit: Callable[[Dataset], None], which: list[int]) -> None:
    for k in which:
        ds = pydicom.dcmread(paths[k])
        edit(ds)
        ds.save_as(paths[k], enforce_file_format=False)


def _header_case(rng: random.Random) -> tuple[str, str, Callable[[Path], None]]:
    keyword = rng.choice(ATTRIBUTES)
    delete = rng.random() < 0.15
    value = b"" if delete else raw_value(keyword, rng)
    scope = rng.choice(("one", "all"))
    seed = rng.randrange(1000)
    kind = "geometry" if keyword in GEOMETRY else "pixel" if keyword in PIXEL else "header"
    shown = "deleted" if delete else repr(value[:24])

    def edit(ds: Dataset) -> None:
        if delete:
            tag = Tag(tag_for_keyword(keyword))
            if tag in ds:
                del ds[tag]
        else:
            set_raw(ds, keyword, value)

    def write(folder: Path) -> None:
        paths = base_series(folder, seed)
        mutate(paths, edit, [2] if scope == "one" else list(range(len(paths))))

    return kind, f"{keyword}={shown} ({scope})", write


def _truncation_case(rng: random.Random) -> tuple[str, str, Callable[[Path], None]]:
    cut = rng.choice((0.05, 0.2, 0.5, 0.8, 0.95, 0.99, 3000))
    at = rng.randrange(5)
    seed = rng.randrange(1000)

    def write(folder: Path) -> None:
        paths = base_series(folder, seed)
        data = paths[at].read_bytes()
        keep = cut if isinstance(cut, int) else int(len(data) * cut)
        paths[at].write_bytes(data[:keep])

    return "truncation", f"slice {at} cut at {cut}", write


def _frames_bomb(folder: Path, frames: str) -> None:
    paths = base_series(folder, 1)
    mutate(paths, lambda ds: set_raw(ds, "NumberOfFrames", frames.encode()), [2])


def _enhanced_bomb(folder: Path) -> None:
    path = make_enhanced_series(folder, n_frames=3)
    ds = pydicom.dcmread(path)
    set_raw(ds, "NumberOfFrames", b"1000000")
    ds.PerFrameFunctionalGroupsSequence = []
    ds.save_as(path, enforce_file_format=False)


def _private_blob(ds: Dataset, size: int) -> None:
    ds.add_new(0x00090010, "LO", "RADSERVE TEST")
    ds.add_new(0x00091000, "OB", bytes(size))


def _zip_bomb(folder: Path) -> None:
    """A small zip whose one DICOM member holds a BOMB_BYTES private OB element."""
    source = folder / "src"
    paths = base_series(source, 2)
    ds = pydicom.dcmread(paths[0])
    _private_blob(ds, BOMB_BYTES)
    ds.save_as(paths[0], enforce_file_format=False)
    with zipfile.ZipFile(folder / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for path in paths:
            zf.write(path, path.name)
    for path in paths:
        path.unlink()
    source.rmdir()


def _deflate_bomb(folder: Path) -> None:
    """A Deflated Explicit VR file that inflates to more than BOMB_BYTES."""
    paths = base_series(folder, 3)
    ds = pydicom.dcmread(paths[0])
    _private_blob(ds, BOMB_BYTES)
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    ds.save_as(paths[0], enforce_file_format=False)


def _element_bomb(folder: Path) -> None:
    """A plain (Explicit VR) slice holding a BOMB_BYTES private OB element: a sender's
    huge instance, with nothing compressed about it."""
    paths = base_series(folder, 5)
    ds = pydicom.dcmread(paths[2])
    _private_blob(ds, BOMB_BYTES)
    ds.save_as(paths[2], enforce_file_format=False)


def _lying_length(folder: Path) -> None:
    """A private element whose length claims 2 GB in a file of a few KB."""
    paths = base_series(folder, 4)
    data = bytearray(paths[1].read_bytes())
    ds = pydicom.dcmread(paths[1], stop_before_pixels=True)
    assert ds is not None
    marker = struct.pack("<HH", 0x0010, 0x0010)  # Patient's Name: VR PN, 2-byte length
    at = bytes(data).find(marker)
    blob = struct.pack("<HH", 0x0009, 0x1000) + b"OB\0\0" + struct.pack("<L", 0x7FFFFFF0)
    data[at:at] = blob
    paths[1].write_bytes(bytes(data))


def _enhanced_ct_flag(path: Path) -> bool:
    return pydicom.dcmread(path, stop_before_pixels=True).SOPClassUID == EnhancedCTImageStorage


BOMBS: tuple[tuple[str, Callable[[Path], None]], ...] = (
    ("NumberOfFrames=1e9", lambda f: _frames_bomb(f, "1e9")),
    ("NumberOfFrames=2147483647", lambda f: _frames_bomb(f, "2147483647")),
    ("NumberOfFrames=0", lambda f: _frames_bomb(f, "0")),
    ("NumberOfFrames=-5", lambda f: _frames_bomb(f, "-5")),
    ("enhanced CT, NumberOfFrames=1e6, no functional groups", _enhanced_bomb),
    ("zip: one member with a 256 MB private element", _zip_bomb),
    ("deflated file inflating past 256 MB", _deflate_bomb),
    ("plain file with a 256 MB private element", _element_bomb),
    ("private element claiming 2 GB", _lying_length),
)


def cases(count: int, seed: int = 12) -> Iterator[Case]:
    """``count`` cases: every bomb first, then seeded header mutations and truncations."""
    rng = random.Random(seed)
    for number, (name, write) in enumerate(BOMBS[:count]):
        yield Case(number, "bomb", name, write)
    for number in range(len(BOMBS), count):
        maker = _truncation_case if rng.random() < 0.15 else _header_case
        kind, name, write = maker(rng)
        yield Case(number, kind, name, write)


def nest_sequences(path: Path, depth: int) -> None:
    """Insert a Content Sequence nested ``depth`` deep (undefined lengths, one item per
    level) before the Pixel Data of the Explicit VR Little Endian file at ``path``:
    pydicom cannot write such a dataset, a hostile sender writes the bytes."""
    data = path.read_bytes()
    at = data.rfind(b"\xe0\x7f\x10\x00OW")
    undefined = 0xFFFFFFFF
    level = struct.pack("<HH2sHL", 0x0040, 0xA730, b"SQ", 0, undefined)
    level += struct.pack("<HHL", 0xFFFE, 0xE000, undefined)
    close = struct.pack("<HHL", 0xFFFE, 0xE00D, 0) + struct.pack("<HHL", 0xFFFE, 0xE0DD, 0)
    path.write_bytes(data[:at] + level * depth + close * depth + data[at:])


def private_elements(path: Path, count: int) -> None:
    """Insert ``count`` private LO elements of 2 bytes (10 bytes each in the file) before
    the Pixel Data of the Explicit VR Little Endian file at ``path``."""
    data = path.read_bytes()
    at = data.rfind(b"\xe0\x7f\x10\x00")
    per_group = 0x10000 - 0x1000
    blob = b"".join(
        struct.pack("<HH", 0x0011 + 2 * (k // per_group), 0x1000 + k % per_group) + b"LO\x02\0x "
        for k in range(count)
    )
    path.write_bytes(data[:at] + blob + data[at:])
