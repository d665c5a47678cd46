"""The variants ``tools/edge_probe.py`` sends through every door: how each one changes a
small CT study (``tests.factories.service.make_study``: 12 slices of 40 x 40, one 700 HU
lesion), and what radserve must answer ("ok", "refuse" or "either").

Encodings, pixel attributes that contradict the data, pixel formats, rescale values,
geometry, other series in the study, identifiers, character sets, broken encapsulated
pixel data for every compressed transfer syntax radserve accepts, and broken files.
What a real scanner and PACS send beyond these is in ``tools/edge_scanner_variants.py``.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from pydicom.encaps import encapsulate
from pydicom.filewriter import dcmwrite
from pydicom.uid import ExplicitVRBigEndian, ImplicitVRLittleEndian, RLELossless
from tests.factories.dicom_series import make_ct_series
from tests.factories.service import GRID, ORIGIN, lesion_hu

NAME = "Edgeprobe^Quintilla"  # the patient's name in every variant: never in a log
NAME_PARTS = ("Edgeprobe", "Quintilla")

Files = list[Path]


# --- variants -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    name: str
    make: Callable[[Path, Files], None]  # changes the study's files in place
    expect: str  # "ok": must succeed with the good findings; "refuse"; "either"
    secrets: tuple[bytes, ...] = ()  # more byte strings never to be logged
    # doors whose answer may differ by design (docs/conformance.md 1.1), e.g. C-STORE
    # for Big Endian: the SCP does not negotiate it, storescu sends little endian instead
    agree_except: tuple[str, ...] = ()
    # a success must carry a report warning holding this text (e.g. "lossy compressed":
    # the study is valid, the reader must know what the models ran on)
    warning: str = ""


def _edit(files: Files, change: Callable[[pydicom.Dataset, int], Any], which: Any = None) -> None:
    """Read, change and write back (pydicom, the file's own transfer syntax) ``which`` files."""
    for k, path in enumerate(files):
        if which is not None and k not in which:
            continue
        ds = pydicom.dcmread(path)
        change(ds, k)
        ds.save_as(path, enforce_file_format=True)


def _pixels(ds: pydicom.Dataset) -> np.ndarray:
    return np.frombuffer(ds.PixelData, dtype="<u2").reshape(ds.Rows, ds.Columns)


def _write_syntax(files: Files, syntax: str) -> None:
    for path in files:
        ds = pydicom.dcmread(path)
        big = syntax == ExplicitVRBigEndian
        if big:
            ds.PixelData = _pixels(ds).astype(">u2").tobytes()
        ds.file_meta.TransferSyntaxUID = syntax
        implicit = syntax == ImplicitVRLittleEndian
        dcmwrite(path, ds, implicit_vr=implicit, little_endian=not big, force_encoding=True)


def _replace_bytes(files: Files, old: bytes, new: bytes) -> None:
    for path in files:
        data = path.read_bytes()
        assert old in data, (path, old)
        path.write_bytes(data.replace(old, new, 1))


def _before_pixel_data(files: Files, blob: bytes) -> None:
    """Insert raw (explicit VR little endian) elements just before Pixel Data."""
    for path in files:
        data = path.read_bytes()
        at = data.rindex(b"\xe0\x7f\x10\x00")
        path.write_bytes(data[:at] + blob + data[at:])


def _nested_sequences(depth: int) -> bytes:
    creator = b"\xdf\x7f\x10\x00LO\x04\x00EDGE"
    inner = b""
    for _ in range(depth):
        item = (
            b"\xfe\xff\x00\xe0\xff\xff\xff\xff" + creator + inner + b"\xfe\xff\x0d\xe0" + bytes(4)
        )
        inner = (
            b"\xdf\x7f\x00\x10SQ\x00\x00\xff\xff\xff\xff" + item + b"\xfe\xff\xdd\xe0" + bytes(4)
        )
    return creator + inner


def _odd_length(files: Files) -> None:
    _edit(files, lambda ds, k: setattr(ds, "StudyDescription", "EDGE"))
    # (0008,1030) LO, length 4 "EDGE" -> length 3 "EDG": an odd-length value
    _replace_bytes(files, b"\x08\x00\x30\x10LO\x04\x00EDGE", b"\x08\x00\x30\x10LO\x03\x00EDG")


def _set(**values: Any) -> Callable[[Path, Files], None]:
    def make(folder: Path, files: Files) -> None:
        def change(ds: pydicom.Dataset, k: int) -> None:
            for key, value in values.items():
                setattr(ds, key, value)

        _edit(files, change)

    return make


def _on_slice(k0: int, **values: Any) -> Callable[[Path, Files], None]:
    def make(folder: Path, files: Files) -> None:
        def change(ds: pydicom.Dataset, k: int) -> None:
            for key, value in values.items():
                setattr(ds, key, value(ds) if callable(value) else value)

        _edit(files, change, which={k0})

    return make


def _float_pixels(keyword: str, dtype: str) -> Callable[[Path, Files], None]:
    def change(ds: pydicom.Dataset, k: int) -> None:
        hu = _pixels(ds).astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        del ds.PixelData
        for key in ("PixelRepresentation", "BitsStored", "HighBit", "RescaleSlope"):
            delattr(ds, key)
        del ds.RescaleIntercept
        ds.BitsAllocated = 32 if dtype == "<f4" else 64
        setattr(ds, keyword, hu.astype(dtype).tobytes())

    return lambda folder, files: _edit(files, change)


def _colour(photometric: str, planar: int | None = None) -> Callable[[Path, Files], None]:
    def change(ds: pydicom.Dataset, k: int) -> None:
        grey = (_pixels(ds) >> 4).astype(np.uint8)
        rgb = np.stack([grey] * 3, axis=-1)
        if planar == 1:
            rgb = np.moveaxis(rgb, -1, 0)
        ds.PixelData = np.ascontiguousarray(rgb).tobytes()
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 3, photometric
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        ds.PlanarConfiguration = planar or 0

    return lambda folder, files: _edit(files, change, which={3})


def _palette(folder: Path, files: Files) -> None:
    def change(ds: pydicom.Dataset, k: int) -> None:
        ds.PhotometricInterpretation = "PALETTE COLOR"
        for colour in ("Red", "Green", "Blue"):
            setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [256, 0, 16])
            ds[f"{colour}PaletteColorLookupTableDescriptor"].VR = "US"
            lut = (np.arange(256, dtype="<u2") * 257).tobytes()
            setattr(ds, f"{colour}PaletteColorLookupTableData", lut)

    _edit(files, change)


def _one_bit(folder: Path, files: Files) -> None:
    def change(ds: pydicom.Dataset, k: int) -> None:
        bits = np.packbits(_pixels(ds) > 1100, bitorder="little")
        ds.PixelData = bits.tobytes()
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 1, 1, 0, 0

    _edit(files, change)


def _thirty_two_bit(folder: Path, files: Files) -> None:
    def change(ds: pydicom.Dataset, k: int) -> None:
        ds.PixelData = _pixels(ds).astype("<u4").tobytes()
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 32, 32, 31

    _edit(files, change)


def _fractional_rescale(folder: Path, files: Files) -> None:
    """Slope 0.5, intercept -1024.5: the same HU from stored values twice as large."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        hu = _pixels(ds).astype(np.float64) + float(ds.RescaleIntercept)
        ds.PixelData = np.round((hu + 1024.5) / 0.5).astype("<u2").tobytes()
        ds.RescaleSlope, ds.RescaleIntercept, ds.BitsStored, ds.HighBit = "0.5", "-1024.5", 16, 15

    _edit(files, change)


def _monochrome1(folder: Path, files: Files) -> None:
    _edit(files, lambda ds, k: setattr(ds, "PhotometricInterpretation", "MONOCHROME1"))


def _shift_slice(folder: Path, files: Files) -> None:
    """Slice 5 at slice 4's position (a duplicate position, different content)."""
    position = pydicom.dcmread(files[4], stop_before_pixels=True).ImagePositionPatient
    _edit(files, lambda ds, k: setattr(ds, "ImagePositionPatient", position), which={5})


def _other_series(kind: str) -> Callable[[Path, Files], None]:
    def make(folder: Path, files: Files) -> None:
        first = pydicom.dcmread(files[0], stop_before_pixels=True)
        common = {
            **GRID,
            "origin": ORIGIN,
            "hu": lesion_hu(),
            "study_uid": first.StudyInstanceUID,
            "extra": {"PatientName": NAME},
        }
        if kind == "localizer":
            make_study_series = {
                "n_slices": 1,
                "orientation": (0.0, 1.0, 0.0, 0.0, 0.0, -1.0),
                "image_type": ("ORIGINAL", "PRIMARY", "LOCALIZER"),
                "series_number": 90,
                "prefix": "loc",
            }
        else:
            make_study_series = {
                "n_slices": 8,
                "orientation": (1.0, 0.0, 0.0, 0.0, 0.0, -1.0),
                "image_type": ("DERIVED", "SECONDARY", "REFORMATTED"),
                "series_number": 91,
                "prefix": "ref",
            }
        make_ct_series(folder, **{**common, **make_study_series})

    return make


def _duplicate_sop(folder: Path, files: Files) -> None:
    """Slice 7 reuses slice 6's SOP Instance UID (different position and pixels)."""
    uid = pydicom.dcmread(files[6], stop_before_pixels=True).SOPInstanceUID

    def change(ds: pydicom.Dataset, k: int) -> None:
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = uid

    _edit(files, change, which={7})


def _bad_uid(value: str) -> Callable[[Path, Files], None]:
    def change(ds: pydicom.Dataset, k: int) -> None:
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = f"{value}.{k + 1}"

    return lambda folder, files: _edit(files, change)


def _bad_study_uid(value: str) -> Callable[[Path, Files], None]:
    return lambda folder, files: _edit(files, lambda ds, k: setattr(ds, "StudyInstanceUID", value))


def _charset(charset: str | None, raw: bytes) -> Callable[[Path, Files], None]:
    """Patient's Name as ``raw`` bytes under Specific Character Set ``charset``."""

    def make(folder: Path, files: Files) -> None:
        def change(ds: pydicom.Dataset, k: int) -> None:
            if charset is None:
                if "SpecificCharacterSet" in ds:
                    del ds.SpecificCharacterSet
            else:
                ds.SpecificCharacterSet = charset.split("\\")
            ds.PatientName = "PLACEHOLDERNAME"

        _edit(files, change)
        name = raw + (b" " if len(raw) % 2 else b"")
        _replace_bytes(
            files,
            b"\x10\x00\x10\x00PN\x10\x00PLACEHOLDERNAME ",
            b"\x10\x00\x10\x00PN" + struct.pack("<H", len(name)) + name,
        )

    return make


JAPANESE = "Yamada^Tarou=\x1b$B;3ED\x1b(B^\x1b$BB@O:\x1b(B".encode("latin-1")  # ISO 2022 IR 87
GB18030 = "Wang^Xiaodong=王^小东".encode("gb18030")
LATIN1 = "Müller^Jürgen".encode("latin-1")

# each codec's start marker, so a decoder gets past its first check
_MARKERS = {
    "1.2.840.10008.1.2.4.50": b"\xff\xd8\xff\xc0",
    "1.2.840.10008.1.2.4.57": b"\xff\xd8\xff\xc3",
    "1.2.840.10008.1.2.4.70": b"\xff\xd8\xff\xc3",
    "1.2.840.10008.1.2.4.80": b"\xff\xd8\xff\xf7",
    "1.2.840.10008.1.2.4.81": b"\xff\xd8\xff\xf7",
    "1.2.840.10008.1.2.4.90": b"\xff\x4f\xff\x51",
    "1.2.840.10008.1.2.4.91": b"\xff\x4f\xff\x51",
    "1.2.840.10008.1.2.4.201": b"\xff\x4f\xff\x51",
    "1.2.840.10008.1.2.4.202": b"\xff\x4f\xff\x51",
    "1.2.840.10008.1.2.4.203": b"\xff\x4f\xff\x51",
    "1.2.840.10008.1.2.5": struct.pack("<16I", 1, 64, *([0] * 14)),
}


def _broken_encapsulated(syntax: str, how: str) -> Callable[[Path, Files], None]:
    def change(ds: pydicom.Dataset, k: int) -> None:
        rng = random.Random(k)
        body = _MARKERS[syntax] + bytes(rng.getrandbits(8) for _ in range(600))
        if how == "garbage":
            ds.PixelData = encapsulate([body])
        elif how == "offsets":  # a Basic Offset Table pointing past the fragments
            data = bytearray(encapsulate([body[:300], body[300:]], has_bot=True))
            data[8:12] = struct.pack("<I", 4)
            data[12:16] = struct.pack("<I", 0x7FFFFFF0)
            ds.PixelData = bytes(data)
        ds.file_meta.TransferSyntaxUID = syntax
        ds["PixelData"].VR = "OB"
        ds["PixelData"].is_undefined_length = True

    return lambda folder, files: _edit(files, change)


def _rle_truncated_fragment(folder: Path, files: Files) -> None:
    """Real RLE, each fragment cut to half (the item's length says so)."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        ds.compress(RLELossless)
        frames = list(pydicom.encaps.generate_frames(ds.PixelData, number_of_frames=1))
        ds.PixelData = encapsulate([frames[0][: len(frames[0]) // 2]])

    _edit(files, change)


def _truncated(folder: Path, files: Files) -> None:
    data = files[5].read_bytes()
    files[5].write_bytes(data[: len(data) * 2 // 3])


def _trailing_garbage(folder: Path, files: Files) -> None:
    for path in files:
        with open(path, "ab") as fh:
            fh.write(b"\x00\x01garbage-after-the-data-set" * 37)


def _huge_length(folder: Path, files: Files) -> None:
    # a private OB element that declares 0xFFFFFFF0 bytes before Pixel Data
    _before_pixel_data(
        files[2:3],
        b"\xdf\x7f\x10\x00LO\x04\x00EDGE\xdf\x7f\x00\x10OB\x00\x00" + b"\xf0\xff\xff\xff",
    )


def _missing(*keys: str, which: Any = None) -> Callable[[Path, Files], None]:
    def change(ds: pydicom.Dataset, k: int) -> None:
        for key in keys:
            if key in ds:
                delattr(ds, key)

    return lambda folder, files: _edit(files, change, which=which)


ACCEPTED_COMPRESSED = [
    "1.2.840.10008.1.2.4.70",
    "1.2.840.10008.1.2.4.57",
    "1.2.840.10008.1.2.4.80",
    "1.2.840.10008.1.2.4.90",
    "1.2.840.10008.1.2.4.201",
    "1.2.840.10008.1.2.4.202",
    "1.2.840.10008.1.2.5",
    "1.2.840.10008.1.2.4.50",
    "1.2.840.10008.1.2.4.81",
    "1.2.840.10008.1.2.4.91",
    "1.2.840.10008.1.2.4.203",
]


# --ci: the variants that found a defect, and a spread over the kinds (each through one
# door in turn, so that every door is used)
CI_VARIANTS = (
    "rgb_slice_in_ct",
    "palette_colour_ct",
    "one_bit",
    "missing_bits_allocated",
    "fractional_slope_intercept",
    "charset_latin1_undeclared",
    "truncated_file",
    "garbage_fragments_1.2.840.10008.1.2.4.90",
    *(AGREEMENT_VARIANTS := ("big_endian", "duplicate_sop_uid")),
    # tools/edge_scanner_variants.py: one of each kind (geometry: a tilted gantry and
    # instances out of order, session 17; another image in the CT series; an Enhanced CT
    # whose frames disagree) and the four that found defects (a DERIVED copy and screen
    # captures beside the CT, session 17: series selection ran the wrong series). The
    # doors fall by the variants' order in the lists, so that the character-set one goes
    # to STOW-RS, whose DICOM results dciodvfy reads (a fifth scanner variant before it
    # would move it: add them in fours, or check where it falls)
    "gantry_tilt",
    "instances_shuffled",
    "dose_screenshot_in_series",
    "derived_tie_in_study",
    "screen_captures_in_study",
    "enhanced_ct_frame_orientation",
    "unsigned_declared_for_signed",
    "charset_utf8_undeclared",
)
# In --ci these go through every door, and the doors must answer them alike (one rule
# per door, docs/conformance.md 1.1): they disagreed before 2026-12-03.


def variants() -> list[Variant]:
    v = Variant
    out = [
        v(
            "big_endian",
            lambda f, s: _write_syntax(s, ExplicitVRBigEndian),
            "refuse",
            agree_except=("cstore",),
        ),
        v("implicit_vr", lambda f, s: _write_syntax(s, ImplicitVRLittleEndian), "ok"),
        v("odd_length_value", lambda f, s: _odd_length(s), "ok"),
        v("nested_sequences_64", lambda f, s: _before_pixel_data(s, _nested_sequences(64)), "ok"),
        v(
            "nested_sequences_3000",
            lambda f, s: _before_pixel_data(s, _nested_sequences(3000)),
            "either",
        ),
        v("rows_too_large", _set(Rows=41), "refuse"),
        v("columns_too_small", _set(Columns=20), "refuse"),
        v("bits_allocated_8", _set(BitsAllocated=8, BitsStored=8, HighBit=7), "refuse"),
        v("samples_per_pixel_3", _set(SamplesPerPixel=3), "refuse"),
        v("pixel_representation_signed", _set(PixelRepresentation=1), "ok"),
        v("missing_rows", _missing("Rows"), "refuse"),
        v("missing_bits_allocated", _missing("BitsAllocated"), "refuse"),
        v("float_pixel_data", _float_pixels("FloatPixelData", "<f4"), "either"),
        v("double_float_pixel_data", _float_pixels("DoubleFloatPixelData", "<f8"), "either"),
        v("monochrome1", _monochrome1, "ok"),
        v("rgb_slice_in_ct", _colour("RGB"), "refuse"),
        v("rgb_planar_slice_in_ct", _colour("RGB", planar=1), "refuse"),
        v("ybr_full_slice_in_ct", _colour("YBR_FULL"), "refuse"),
        v("palette_colour_ct", _palette, "refuse"),
        v("one_bit", _one_bit, "refuse"),
        v("thirty_two_bit", _thirty_two_bit, "ok"),
        v("rescale_slope_zero", _set(RescaleSlope="0"), "refuse"),
        v("rescale_slope_nan", _set(RescaleSlope="NaN"), "refuse"),
        v("rescale_slope_huge", _set(RescaleSlope="1e30"), "refuse"),
        v("fractional_slope_intercept", _fractional_rescale, "ok"),
        v("missing_position", _missing("ImagePositionPatient"), "refuse"),
        v("missing_orientation", _missing("ImageOrientationPatient"), "refuse"),
        v("missing_position_one_slice", _missing("ImagePositionPatient", which={4}), "either"),
        v("zero_orientation", _set(ImageOrientationPatient=[0, 0, 0, 0, 0, 0]), "refuse"),
        v(
            "non_orthonormal_orientation",
            _set(ImageOrientationPatient=[1, 0, 0, 0.5, 1, 0]),
            "refuse",
        ),
        v("duplicate_position", _shift_slice, "either"),
        v(
            "mixed_orientation",
            _on_slice(6, ImageOrientationPatient=[1, 0, 0, 0, 0, -1]),
            "either",
        ),
        v("mixed_size", _on_slice(6, Rows=20, Columns=80), "either"),
        v("localizer_in_study", _other_series("localizer"), "ok"),
        v("reformat_in_study", _other_series("reformat"), "ok"),
        v("duplicate_sop_uid", _duplicate_sop, "refuse"),
        v("uid_invalid_chars", _bad_uid("1.2.3.abc_def"), "refuse"),
        v("uid_too_long", _bad_uid("1." + "2" * 70), "refuse"),
        v("study_uid_too_long", _bad_study_uid("1." + "3" * 70), "refuse"),
        v(
            "charset_iso2022_ir87",
            _charset("\\ISO 2022 IR 87", JAPANESE),
            "ok",
            secrets=(JAPANESE,),
        ),
        v(
            "charset_gb18030",
            _charset("GB18030", GB18030),
            "ok",
            secrets=(GB18030, b"Wang"),
        ),
        v(
            "charset_latin1_undeclared",
            _charset(None, LATIN1),
            "ok",
            secrets=(LATIN1, "Müller".encode()),
        ),
        v(
            "charset_mixed",
            _charset("ISO_IR 100\\ISO 2022 IR 87", LATIN1),
            "ok",
            secrets=(LATIN1, "Müller".encode()),
        ),
        v("rle_truncated_fragments", _rle_truncated_fragment, "refuse"),
        v("truncated_file", _truncated, "either"),
        v("trailing_garbage", lambda f, s: _trailing_garbage(f, s), "either"),
        v("huge_declared_length", _huge_length, "either"),
    ]
    for syntax in ACCEPTED_COMPRESSED:
        out.append(
            v(
                f"garbage_fragments_{syntax}",
                _broken_encapsulated(syntax, "garbage"),
                "refuse",
            )
        )
        out.append(
            v(f"bad_offset_table_{syntax}", _broken_encapsulated(syntax, "offsets"), "refuse")
        )
    return out
