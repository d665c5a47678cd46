"""Hostile DICOM at every door of a real ``radserve serve``: variants nobody sent yet.

    PYTHONPATH=src:. python tools/edge_probe.py            # every variant, every door
    PYTHONPATH=src:. python tools/edge_probe.py --ci       # the short mode the test runs
    PYTHONPATH=src:. python tools/edge_probe.py --variant big_endian --door stow

Each variant is a small CT study (12 slices of 40 x 40, one 700 HU lesion, tests'
``make_study``) changed with pydicom or at the byte level: encodings (big endian,
implicit VR, odd lengths, deep undefined-length sequences), pixel attributes that
contradict the data, pixel formats (float, double, MONOCHROME1, colour, planar, 1- and
32-bit), rescale values, geometry (missing, zero, non-orthonormal, duplicate, mixed),
other series in the study (localizer, reformat), identifiers (duplicate SOP Instance
UIDs, bad or long UIDs), character sets, broken encapsulated pixel data for every
compressed transfer syntax radserve accepts, and broken files (truncated, trailing
garbage, a huge declared length). See docs/hostile-input.md for the list.

Doors: ``cstore`` (dcmtk's storescu to the gateway, with a good study on the same
association), ``stow`` (STOW-RS), ``form`` (``POST /v1/studies``) — each followed by a
good study — and ``run`` (``radserve run`` on the variant's folder, its own process).

Per variant and door the probe checks: no HTTP 5xx, no traceback or non-JSON line in
the server's log, the patient's name never in a log line or on stderr; a job that fails
fails with a specific error code (never ``internal_error``) and a one-line message; a
variant that must work succeeds with the good study's findings; the good study sent
beside it succeeds with its own findings (nothing lost or mixed); the server still
answers ``/healthz``; its peak RSS (server and children, ``VmHWM`` reset before each
case) stays within ``--rss-bound-mb`` of a good study's, and its open files come back
within ``--fd-slack`` of the count before the case. Prints one line per case and a
JSON summary; exits 1 when any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pydicom
from pydicom.encaps import encapsulate
from pydicom.filewriter import dcmwrite
from pydicom.uid import (
    ExplicitVRBigEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
)
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.dicom_series import make_ct_series
from tests.factories.ports import free_port
from tests.factories.server_process import (
    create_key_cli,
    gateway_pending,
    peak_rss_mb,
    radserve_command,
    reset_peak_rss,
    start_server,
    stop_servers,
)
from tests.factories.service import GRID, ORIGIN, config_file, lesion_hu, make_study
from tests.factories.waits import wait_until

NAME = "Edgeprobe^Quintilla"  # the patient's name in every variant: never in a log
NAME_PARTS = ("Edgeprobe", "Quintilla")
CALLING = "EDGEPROBE"
FINAL = {"succeeded", "failed", "cancelled"}

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


# --- the server ------------------------------------------------------------------------------
@dataclass
class Case:
    variant: str
    door: str
    problems: list[str] = field(default_factory=list)
    outcome: str = ""
    peak_mb: float = 0.0
    fds: int = 0
    # the door's answer to the variant, comparable between doors: "ok" (its job
    # succeeded) or radserve's error code (the job's, the form's, STOW-RS's (0009,1001),
    # `radserve run`'s); "" when the door gave none (storescu would not send it)
    code: str = ""


class Server:
    def __init__(self, root: Path) -> None:
        self.gateway_port = free_port()
        gateway = {
            "enabled": True,
            "port": self.gateway_port,
            "quiet_s": 0.5,
            "interrupted_quiet_s": 1.0,
            "allowed_peers": [{"ae_title": CALLING, "host": "127.0.0.1"}],
        }
        self.config = config_file(root, gateway=gateway)
        self.data, self.log = root / "data", root / "server.log"
        port = free_port()
        self.process = start_server(self.config, self.data, port, self.log)
        self.url = f"http://127.0.0.1:{port}"
        self.submit = create_key_cli(self.config, self.data, "submit")
        self.read = create_key_cli(self.config, self.data, "read")
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def close(self) -> None:
        self.client.close()
        stop_servers([self.process])

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def jobs(self) -> list[dict[str, Any]]:
        jobs, cursor = [], None
        while True:
            params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
            page = self.client.get("/v1/jobs", params=params, headers=self.headers(self.read))
            page.raise_for_status()
            body = page.json()
            jobs += body["items"]
            cursor = body.get("next_cursor")
            if not cursor:
                return jobs

    def job(self, job_id: str) -> dict[str, Any]:
        return self.client.get(f"/v1/jobs/{job_id}", headers=self.headers(self.read)).json()

    def report(self, job_id: str) -> dict[str, Any] | None:
        got = self.client.get(f"/v1/jobs/{job_id}/report", headers=self.headers(self.read))
        return got.json() if got.status_code == 200 else None

    def settled(self) -> bool:
        return not gateway_pending(self.data) and all(j["state"] in FINAL for j in self.jobs())

    def healthy(self) -> bool:
        try:
            return self.client.get("/healthz", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    def reset_peak(self) -> None:
        reset_peak_rss(self.process.pid)

    def peak_mb(self) -> float:
        return peak_rss_mb(self.process.pid)

    def open_files(self) -> int:
        """The server process's open files (its children come and go: a decoding pool
        started again after a decoder crashed is new processes, not a leak)."""
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


def _findings(report: dict[str, Any] | None) -> list[tuple[str, int]]:
    """What must match between a variant and the good study: each finding's label and its
    volume rounded to 10 % steps of the lesion (4 mm sphere, about 0.27 ml)."""
    if not report:
        return []
    out = []
    for f in report.get("findings", []):
        volume = f.get("volume_ml") or f.get("measurements", {}).get("volume_ml") or 0.0
        out.append((str(f.get("label") or f.get("name")), round(float(volume) / 0.03)))
    return sorted(out)


# --- doors -----------------------------------------------------------------------------------
def _study_uid(folder: Path) -> str | None:
    for path in sorted(folder.rglob("*.dcm")):
        with contextlib.suppress(Exception):
            return str(pydicom.dcmread(path, stop_before_pixels=True, force=True).StudyInstanceUID)
    return None


def _stow_body(files: Files) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        b"--" + boundary.encode() + b"\r\nContent-Type: application/dicom\r\n\r\n" + p.read_bytes()
        for p in files
    ]
    body = b"\r\n".join(parts) + b"\r\n--" + boundary.encode() + b"--\r\n"
    return body, f'multipart/related; type="application/dicom"; boundary={boundary}'


def _stow_reasons(got: httpx.Response, case: Case, label: str) -> None:
    """The Failure Reasons (and their comments) of a Store Instances Response."""
    failed = got.json().get("00081198", {}).get("Value", [])
    reasons = sorted({f"0x{item['00081197']['Value'][0]:04X}" for item in failed})
    codes = [item.get("00091001", {}).get("Value", [""])[0] for item in failed]
    if label == "variant" and any(codes):
        case.code = case.code or next(c for c in codes if c)
    if reasons:
        case.outcome += f"{label} {len(failed)} failed {','.join(reasons)}; "
    if "0x0110" in reasons:  # processing failure: radserve did not say what was wrong
        case.problems.append(f"{label}: STOW-RS failure 0x0110 (processing failure)")


def _submit_http(server: Server, door: str, files: Files, case: Case, label: str) -> list[str]:
    """Send ``files`` through ``door``; the ids of the jobs it started."""
    if door == "form":
        upload = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in files]
        got = server.client.post("/v1/studies", files=upload, headers=server.headers(server.submit))
    else:
        body, media = _stow_body(files)
        headers = {**server.headers(server.submit), "Content-Type": media}
        got = server.client.post("/dicomweb/studies", content=body, headers=headers)
    case.outcome += f"{label} HTTP {got.status_code}; "
    if got.status_code >= 500 and got.status_code != 503:
        case.problems.append(f"{label}: HTTP {got.status_code} {got.text[:200]}")
    if got.status_code >= 400:
        try:
            error = got.json()
        except ValueError:
            case.problems.append(f"{label}: HTTP {got.status_code} without a JSON body")
            return []
        if door == "stow" and "error" not in error:
            _stow_reasons(got, case, label)
        elif door == "stow" or door == "form":
            code = error.get("error", {}).get("code")
            case.outcome += f"{label} refused [{code}] {error.get('error', {}).get('message')}; "
            if label == "variant":
                case.code = case.code or str(code)
            if code in (None, "internal_error"):
                case.problems.append(f"{label}: refused without a specific code: {error}")
        return []
    if door == "form":
        return [got.json()["id"]]
    _stow_reasons(got, case, label)
    links = got.headers.get_list("link") if hasattr(got.headers, "get_list") else []
    return [link.split(">")[0].rsplit("/", 1)[-1] for link in links]


# storescu -R proposes uncompressed syntaxes only unless told; dcmtk 3.6.7 has no option
# for JPEG Lossless process 14 (4.57) or HTJ2K: those go through pynetdicom
_STORESCU_PROPOSES = {
    "1.2.840.10008.1.2.4.70": ["-xs"],
    "1.2.840.10008.1.2.4.50": ["-xy"],
    "1.2.840.10008.1.2.4.80": ["-xt"],
    "1.2.840.10008.1.2.4.81": ["-xu"],
    "1.2.840.10008.1.2.4.90": ["-xv"],
    "1.2.840.10008.1.2.4.91": ["-xw"],
    "1.2.840.10008.1.2.5": ["-xr"],
    **{uid: [] for uid in ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.2")},
}


def _syntax_of(files: list[str]) -> str | None:
    for path in files:
        with contextlib.suppress(Exception):
            return str(pydicom.dcmread(path, stop_before_pixels=True).file_meta.TransferSyntaxUID)
    return None


def _pynetdicom_store(
    server: Server, files: list[str], syntax: str, case: Case, label: str
) -> None:
    """The files as stored (no re-encoding), one association, with pynetdicom."""
    from pynetdicom import AE, _config
    from pynetdicom.sop_class import CTImageStorage

    _config.STORE_SEND_CHUNKED_DATASET = True
    ae = AE(CALLING)
    ae.acse_timeout = ae.network_timeout = ae.dimse_timeout = 60
    ae.add_requested_context(CTImageStorage, syntax)
    assoc = ae.associate("127.0.0.1", server.gateway_port, ae_title="RADSERVE")
    statuses = []
    try:
        for path in files:
            if not assoc.is_established:
                break
            try:
                status = assoc.send_c_store(path)
            except Exception as exc:  # the sender cannot read the file
                statuses.append(type(exc).__name__)
                continue
            statuses.append(f"0x{int(status.Status):04X}" if "Status" in status else "none")
    finally:
        if assoc.is_established:
            assoc.release()
    case.outcome += f"{label} pynetdicom {','.join(sorted(set(statuses)))}; "
    if "none" in statuses:
        case.problems.append(f"{label}: a C-STORE without an answer")


def _storescu(server: Server, folder: Path, case: Case, label: str) -> None:
    """One association per folder: storescu stops at a file it cannot send (exit 192 for
    an invalid UID), which would keep the next study from being sent at all."""
    tool = dcmtk_tool("storescu")
    files = [str(p) for p in sorted(folder.rglob("*.dcm"))]
    syntax = _syntax_of(files)
    if syntax is not None and syntax not in _STORESCU_PROPOSES:
        _pynetdicom_store(server, files, syntax, case, label)
        return
    command = [tool, "-R", *_STORESCU_PROPOSES.get(syntax or "", [])]
    command += ["-aet", CALLING, "-aec", "RADSERVE", "-to", "10", "-ta", "10"]
    command += ["-td", "60", "127.0.0.1", str(server.gateway_port), *files]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    lines = [x.strip() for x in done.stderr.splitlines() if x.strip()]
    case.outcome += f"{label} storescu rc {done.returncode} {' | '.join(lines[-2:])[:200]}; "


def _good_job(server: Server, jobs: list[dict[str, Any]], uid: str) -> dict[str, Any] | None:
    for job in jobs:
        report = server.report(job["id"]) if job["state"] == "succeeded" else None
        if report and report.get("study", {}).get("study_instance_uid") == uid:
            return job
    return None


def _latest_generations(server: Server, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``jobs`` less those a later job of the same study superseded: the gateway hands a
    study over when it has been quiet for ``quiet_s`` and runs it again, whole, when more
    of it arrives (a slow sender); the earlier generations ran on part of it."""
    newest: dict[str, dict[str, Any]] = {}
    kept = []
    for job in sorted(jobs, key=lambda j: j["arrival"]):
        report = server.report(job["id"]) if job["state"] == "succeeded" else None
        uid = (report or {}).get("study", {}).get("study_instance_uid")
        if uid:
            newest[uid] = job
        else:
            kept.append(job)
    return kept + list(newest.values())


def _check_job(
    server: Server, job: dict[str, Any], variant: Variant, case: Case, good: Any
) -> None:
    state, error = job["state"], job.get("error") or {}
    case.outcome += f"job {state}"
    if state == "failed":
        case.code = case.code or str(error.get("code"))
        case.outcome += f" [{error.get('code')}] {error.get('message')}"
        if error.get("code") in (None, "internal_error") or "\n" in str(error.get("message")):
            case.problems.append(f"unclear failure: {error}")
        if variant.expect == "ok":
            case.problems.append(f"must succeed, failed: {error.get('message')}")
    elif state == "succeeded":
        case.code = case.code or "ok"
        found = _findings(server.report(job["id"]))
        if variant.expect == "refuse":
            case.problems.append("must be refused, succeeded")
        if found != good:
            case.problems.append(f"succeeded with findings {found}, the good study's {good}")
    case.outcome += "; "


def probe_http_door(
    server: Server, root: Path, variant: Variant, door: str, good: Any, baseline: float, args: Any
) -> Case:
    case = Case(variant.name, door)
    bad_dir, good_dir = root / f"{door}-{variant.name}", root / f"{door}-{variant.name}-good"
    files = make_study(bad_dir, extra={"PatientName": NAME})
    variant.make(bad_dir, files)
    make_study(good_dir, extra={"PatientName": NAME})
    good_uid = _study_uid(good_dir)
    before = {j["id"] for j in server.jobs()}
    fds = server.open_files()
    mark = server.log.stat().st_size
    server.reset_peak()
    if door == "cstore":
        _storescu(server, bad_dir, case, "variant")
        _storescu(server, good_dir, case, "good")
        started = None
    else:
        started = _submit_http(server, door, sorted(bad_dir.rglob("*.dcm")), case, "variant")
        _submit_http(server, door, sorted(good_dir.rglob("*.dcm")), case, "good")
    if not wait_until(server.settled, 240):
        case.problems.append("not settled within 240 s (a hang)")
    new = [j for j in server.jobs() if j["id"] not in before]
    good_job = _good_job(server, new, good_uid)
    if good_job is None or _findings(server.report(good_job["id"])) != good:
        case.problems.append(
            f"the good study beside it lost or changed: {good_job and good_job['state']}"
        )
    for job in _latest_generations(server, new):
        if good_job and job["id"] == good_job["id"]:
            continue
        if started is not None and job["id"] not in started:
            continue
        _check_job(server, server.job(job["id"]), variant, case, good)
    if variant.expect == "ok" and len(new) < 2:
        case.problems.append("must succeed: no job started for it")
    _common_checks(server, case, variant, mark, baseline, fds, args)
    return case


def _leaks(text: str, variant: Variant) -> list[str]:
    secrets = [*NAME_PARTS, *(s.decode("utf-8", "replace") for s in variant.secrets)]
    return [s for s in secrets if s and s in text]


def _common_checks(
    server: Server, case: Case, variant: Variant, mark: int, baseline: float, fds: int, args: Any
) -> None:
    if server.process.poll() is not None or not server.healthy():
        case.problems.append("server dead or /healthz not answering")
        return
    with open(server.log, "rb") as fh:
        fh.seek(mark)
        raw = fh.read()
    text = raw.decode("utf-8", "replace")
    for line in text.splitlines():
        if "Traceback" in line:
            case.problems.append(f"traceback in the log: {line[:300]}")
            break
        try:
            json.loads(line)
        except ValueError:
            case.problems.append(f"not a JSON log line: {line[:200]}")
            break
    leaked = _leaks(text, variant) + [s.hex() for s in variant.secrets if s in raw]
    if leaked:
        case.problems.append(f"patient name in the log: {leaked}")
    case.peak_mb = server.peak_mb() - baseline
    if case.peak_mb > args.rss_bound_mb:
        case.problems.append(f"peak RSS +{case.peak_mb:.0f} MB > {args.rss_bound_mb} MB")
    case.fds = server.open_files() - fds
    if case.fds > args.fd_slack:
        case.problems.append(f"{case.fds} more open files after the case")


def probe_run_door(root: Path, server: Server, variant: Variant, good: Any, args: Any) -> Case:
    case = Case(variant.name, "run")
    folder = root / f"run-{variant.name}"
    variant.make(folder, make_study(folder, extra={"PatientName": NAME}))
    out = root / f"run-{variant.name}-out"
    command = radserve_command(
        "run", str(folder), "--out", str(out), "--config", str(server.config), "--no-dicom",
        "--no-key-images",
    )  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        case.problems.append("radserve run did not end within 300 s")
        return case
    text = (stdout + stderr).decode("utf-8", "replace")
    rc = process.returncode
    case.outcome = f"exit {rc}: {stderr.decode('utf-8', 'replace').strip().splitlines()[-1:]}"
    if "Traceback" in text:
        case.problems.append(f"traceback: {text[-400:]}")
    if rc not in (0, 2):
        case.problems.append(f"exit status {rc}")
    if rc == 0:
        case.code = "ok"
    elif "error [" in text:
        case.code = text.split("error [", 1)[1].split("]", 1)[0]
    if rc == 2 and "error [" not in text:
        case.problems.append(f"no 'error [code]' line: {text[-300:]}")
    if rc == 2 and variant.expect == "ok":
        case.problems.append("must succeed, refused")
    if rc == 0:
        report = json.loads((out / "report.json").read_text())
        if variant.expect == "refuse":
            case.problems.append("must be refused, succeeded")
        if _findings(report) != good:
            case.problems.append(f"findings {_findings(report)} != the good study's {good}")
    leaked = _leaks(text, variant) + [s.hex() for s in variant.secrets if s in stdout + stderr]
    if leaked:
        case.problems.append(f"patient name on stdout/stderr: {leaked}")
    return case


def _check_agreement(cases: list[Case], by_name: dict[str, Variant]) -> None:
    """One rule per door: the doors that answered a variant answered it alike (the same
    error code, or all "ok")."""
    answers: dict[str, dict[str, str]] = {}
    for case in cases:
        if case.code and case.door not in by_name[case.variant].agree_except:
            answers.setdefault(case.variant, {})[case.door] = case.code
    for name, by_door in answers.items():
        if len(set(by_door.values())) > 1:
            problem = f"the doors disagree: {by_door}"
            print(f"FAIL {name:38} {problem}", flush=True)
            for case in cases:
                if case.variant == name:
                    case.problems.append(problem)


# --- main ------------------------------------------------------------------------------------
DOORS = ("cstore", "stow", "form", "run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ci", action="store_true", help="the short mode: a few variants")
    parser.add_argument("--variant", action="append", help="only these variants (repeatable)")
    parser.add_argument("--door", action="append", choices=DOORS, help="only these doors")
    parser.add_argument("--rss-bound-mb", type=float, default=96.0)
    parser.add_argument("--fd-slack", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write the cases here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)

    chosen = [v for v in variants() if (not args.ci or v.name in CI_VARIANTS)]
    if args.variant:
        chosen = [v for v in variants() if v.name in args.variant]
    doors = args.door or list(DOORS)
    root = Path(tempfile.mkdtemp(prefix="edge-probe-"))
    server = Server(root)
    cases: list[Case] = []
    try:
        warm, good, baseline = Case("good", "all"), None, 0.0
        # warm every door up, and the decoding processes (started by the first compressed
        # study: JPEG 2000 here): their first start is no growth a variant caused
        warm_ups = (("form", None), ("stow", None), ("cstore", None), ("form", "j2k"))
        for k, (door, compressed) in enumerate(warm_ups):
            folder = root / f"good{k}"
            options = {"transfer_syntax": JPEG2000Lossless} if compressed else {}
            make_study(folder, extra={"PatientName": NAME}, **options)
            server.reset_peak()
            before = {j["id"] for j in server.jobs()}
            if door == "cstore":
                _storescu(server, folder, warm, "good")
            else:
                _submit_http(server, door, sorted(folder.rglob("*.dcm")), warm, "good")
            wait_until(server.settled, 240)
            new = [j for j in server.jobs() if j["id"] not in before]
            assert [j["state"] for j in new] == ["succeeded"], (door, new, warm.outcome)
            found = _findings(server.report(new[0]["id"]))
            assert found and found == (good or found), f"the good study's findings: {found}"
            good, baseline = found, max(baseline, server.peak_mb())
        print(f"good study: findings {good}; server peak {baseline:.0f} MB", flush=True)
        # the doors alternate per variant, so every variant goes through each door in
        # full mode, and the CI mode still reaches every door
        for k, variant in enumerate(chosen):
            every = not args.ci or variant.name in AGREEMENT_VARIANTS
            these = doors if every else [doors[k % len(doors)]]
            for door in these:
                judged = variant  # a door that answers otherwise by design may do either
                if door in variant.agree_except:
                    judged = replace(variant, expect="either")
                if door == "run":
                    case = probe_run_door(root, server, judged, good, args)
                else:
                    case = probe_http_door(server, root, judged, door, good, baseline, args)
                cases.append(case)
                mark = "ok  " if not case.problems else "FAIL"
                print(f"{mark} {variant.name:38} {door:6} {case.outcome[:260]}", flush=True)
                for problem in case.problems:
                    print(f"       - {problem[:400]}", flush=True)
    finally:
        server.close()
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    _check_agreement(cases, {v.name: v for v in chosen})
    failed = [c for c in cases if c.problems]
    summary = {
        "cases": len(cases),
        "failed": len(failed),
        "max_peak_mb": max((c.peak_mb for c in cases), default=0.0),
        "max_fds": max((c.fds for c in cases), default=0),
    }
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps([c.__dict__ for c in cases], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
