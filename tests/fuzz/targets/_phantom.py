"""Seed DICOM for the targets: small phantom slices from the test factories, with fixed
study, series and frame-of-reference UIDs so a corpus kept from an earlier run still
belongs to the series :mod:`tests.fuzz.targets.series` builds around it."""

from __future__ import annotations

import contextlib
import functools
import io
import tempfile
from pathlib import Path

import numpy as np
import pydicom
from pydicom.encaps import encapsulate
from pydicom.uid import (
    JPEG2000,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)

from tests.factories.dicom_series import dcmtk_compress, make_ct_series, make_enhanced_series

STUDY_UID = "1.2.826.0.1.3680043.8.498.1001"
SERIES_UID = "1.2.826.0.1.3680043.8.498.1002"
FRAME_UID = "1.2.826.0.1.3680043.8.498.1003"
SLICES = 4
MUTATED = 2  # the slice of a series the fuzzer's bytes replace
PARSER = (
    "pydicom.filereader",
    "pydicom.dataelem",
    "pydicom.dataset",
    "pydicom.values",
    "pydicom.valuerep",
    "pydicom.charset",
    "pydicom.encaps",
    "pydicom.filebase",
    "pydicom.multival",
    "pydicom.sequence",
)
"""pydicom's parsing modules: what most DICOM inputs exercise (its data dictionaries are
left out: instrumenting them costs seconds and finds nothing)."""


def _series(folder: Path, syntax: str) -> list[bytes]:
    paths = make_ct_series(
        folder,
        n_slices=SLICES,
        rows=16,
        cols=12,
        series_uid=SERIES_UID,
        study_uid=STUDY_UID,
        frame_of_reference_uid=FRAME_UID,
        transfer_syntax=syntax,
        prefix=syntax.replace(".", "_"),
    )
    return [p.read_bytes() for p in paths]


@functools.cache
def series_slices() -> tuple[bytes, ...]:
    """The 4 slices (Explicit VR Little Endian) of the series target, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        return tuple(_series(Path(tmp), ExplicitVRLittleEndian))


@functools.cache
def compressed_slices() -> tuple[bytes, ...]:
    """Slice ``MUTATED`` of the series in each compressed syntax radserve decodes that
    has an encoder here, one seed each, so the series target reaches every decoder:
    JPEG-LS lossless and near-lossless (pyjpegls), RLE, JPEG 2000 lossless and lossy
    (Pillow's OpenJPEG: pylibjpeg-openjpeg cannot encode under 32 x 32 pixels), JPEG
    Baseline (Pillow, 8-bit, as archives send it), and JPEG Lossless process 14 and its
    selection value 1 (dcmtk's dcmcjpeg; left out without dcmtk). HTJ2K has no encoder
    here; JPEG Extended is refused before decoding (:mod:`radserve.ingest.rules`)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        out = [
            _series(folder / syntax, syntax)[MUTATED] for syntax in (JPEGLSLossless, RLELossless)
        ]
        out.append(_pydicom_encoded(JPEGLSNearLossless, jls_error=2))
        out += [_j2k(JPEG2000Lossless), _j2k(JPEG2000), _jpeg_baseline()]
        source = folder / "slice.dcm"
        source.write_bytes(series_slices()[MUTATED])
        for name in ("jpeg-lossless", "jpeg-lossless-sv1"):
            with contextlib.suppress(FileNotFoundError):  # no dcmtk here
                out.append(dcmtk_compress(source, folder / f"{name}.dcm", name).read_bytes())
    return tuple(out)


def _pydicom_encoded(syntax: str, **options: object) -> bytes:
    ds = pydicom.dcmread(io.BytesIO(series_slices()[MUTATED]))
    ds.compress(syntax, **options)
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def _eight_bit(ds: pydicom.Dataset) -> pydicom.Dataset:
    """The slice as 8-bit stored values, Rescale Slope 16 (what a JPEG Baseline slice of
    a CT carries)."""
    eight = np.clip(np.rint(ds.pixel_array.astype(np.float64) / 16), 0, 255).astype(np.uint8)
    ds.PixelData = eight.tobytes()
    ds["PixelData"].VR = "OB"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.RescaleSlope = 16
    return ds


def _encapsulated(ds: pydicom.Dataset, syntax: str, frame: bytes) -> bytes:
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds.file_meta.TransferSyntaxUID = syntax
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def _jpeg_baseline() -> bytes:
    from PIL import Image

    ds = _eight_bit(pydicom.dcmread(io.BytesIO(series_slices()[MUTATED])))
    frame = io.BytesIO()
    Image.fromarray(ds.pixel_array, mode="L").save(frame, format="JPEG", quality=90)
    return _encapsulated(ds, JPEGBaseline8Bit, frame.getvalue())


def _j2k(syntax: str) -> bytes:
    from PIL import Image

    ds = pydicom.dcmread(io.BytesIO(series_slices()[MUTATED]))
    frame = io.BytesIO()
    lossy = syntax == JPEG2000
    Image.fromarray(ds.pixel_array.astype(np.uint16)).save(
        frame,
        format="JPEG2000",
        num_resolutions=2,  # 16 x 12 pixels: OpenJPEG's default 6 needs 32 x 32
        irreversible=lossy,
        quality_mode="rates",
        quality_layers=[2] if lossy else None,
        no_jp2=True,
    )
    if lossy:
        ds.LossyImageCompression = "01"
        ds.LossyImageCompressionMethod = "ISO_15444_1"
    return _encapsulated(ds, syntax, frame.getvalue())


@functools.cache
def instances() -> tuple[bytes, ...]:
    """One slice of the series in each syntax the doors take natively or by plugin
    (implicit, explicit, deflated, RLE), an enhanced multi-frame CT, and a bare stream
    without preamble and File Meta (older scanners)."""
    out = [series_slices()[MUTATED]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for syntax in (ImplicitVRLittleEndian, DeflatedExplicitVRLittleEndian, RLELossless):
            out.append(_series(folder / syntax, syntax)[MUTATED])
        enhanced = make_enhanced_series(folder / "enhanced", n_frames=3, rows=8, cols=8)
        out.append(enhanced.read_bytes())
    implicit = out[1]
    meta_end = implicit.index(b"\x08\x00", 132 + 12)  # first data-set tag after the meta
    out.append(implicit[meta_end:])
    return tuple(out)


__all__ = [
    "FRAME_UID",
    "MUTATED",
    "PARSER",
    "SERIES_UID",
    "SLICES",
    "STUDY_UID",
    "compressed_slices",
    "instances",
    "series_slices",
]
