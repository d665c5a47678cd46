"""Variants of ``tools/edge_probe.py`` that a real scanner or PACS sends (session 16).

``tools/edge_variants.py`` breaks a clean study; these are studies a scanner writes in
ways the first set did not try: stacks that are tilted, sheared, unevenly spaced or stored
out of order; a localizer or a dose screenshot (Secondary Capture) in the CT series or
beside it; a thicker second series, an equal DERIVED one, a series of screen captures;
Enhanced CT multi-frame whose per-frame functional groups disagree; pixel encodings
(garbage above Bits Stored, Pixel Padding Value and Range Limit, signed stored values, a
rescale per slice, unsigned declared for signed data, encapsulated data in several or
empty fragments, an Extended Offset Table); and character sets (ISO 2022 IR 149, UTF-8,
an unknown term, UTF-8 undeclared).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from pydicom.encaps import encapsulate, encapsulate_extended, generate_frames
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    JPEG2000Lossless,
    JPEGLSLossless,
    RLELossless,
    SecondaryCaptureImageStorage,
    generate_uid,
)
from tests.factories.dicom_series import CORONAL, make_ct_series, make_enhanced_series
from tests.factories.service import GRID, ORIGIN, lesion_hu
from tools.edge_variants import NAME, Files, Variant, _charset, _edit, _pixels

Make = Callable[[Path, Files], None]


def _study_of(files: Files) -> pydicom.Dataset:
    return pydicom.dcmread(files[0], stop_before_pixels=True)


def _remade(**options: Any) -> Make:
    """The study written again by the factory with ``options`` (same study, same name)."""

    def make(folder: Path, files: Files) -> None:
        study_uid = _study_of(files).StudyInstanceUID
        for path in files:
            path.unlink()
        make_ct_series(
            folder,
            **GRID,
            origin=ORIGIN,
            hu=lesion_hu(),
            study_uid=study_uid,
            extra={"PatientName": NAME},
            **options,
        )

    return make


def _moved_slice(k0: int, shift_mm: tuple[float, float, float]) -> Make:
    """Slice ``k0`` moved in space (a sheared, not linearly tilted, stack)."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        ds.ImagePositionPatient = [
            float(p) + d for p, d in zip(ds.ImagePositionPatient, shift_mm, strict=True)
        ]

    return lambda folder, files: _edit(files, change, which={k0})


def _localizer_in_series(folder: Path, files: Files) -> None:
    """A coronal LOCALIZER image under the CT series' own Series Instance UID."""
    ct = _study_of(files)
    make_ct_series(
        folder,
        n_slices=1,
        rows=40,
        cols=40,
        spacing=(2.0, 1.0, 1.0),
        orientation=CORONAL,
        origin=ORIGIN,
        hu=lesion_hu(),
        image_type=("ORIGINAL", "PRIMARY", "LOCALIZER"),
        series_uid=ct.SeriesInstanceUID,
        study_uid=ct.StudyInstanceUID,
        frame_of_reference_uid=ct.FrameOfReferenceUID,
        extra={"PatientName": NAME},
        prefix="loc",
    )


def _dose_screenshot(same_series: bool) -> Make:
    """A scanner's dose report: an RGB Secondary Capture with Modality CT and no plane
    geometry, in the CT series itself or in a series of its own (number 999)."""

    def make(folder: Path, files: Files) -> None:
        ds = pydicom.dcmread(files[0])
        for keyword in (
            "ImagePositionPatient",
            "ImageOrientationPatient",
            "PixelSpacing",
            "SliceThickness",
            "RescaleSlope",
            "RescaleIntercept",
            "RescaleType",
            "FrameOfReferenceUID",
        ):
            if keyword in ds:
                delattr(ds, keyword)
        ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.ImageType = ["DERIVED", "SECONDARY", "SCREEN SAVE"]
        ds.ConversionType = "WSD"
        ds.InstanceNumber = 1
        if not same_series:
            ds.SeriesInstanceUID, ds.SeriesNumber = generate_uid(), 999
        ds.SeriesDescription = "Dose Report"
        text = np.zeros((64, 64, 3), np.uint8)
        text[8:56:6, 6:58] = (255, 255, 255)  # lines of "text"
        ds.Rows, ds.Columns, ds.SamplesPerPixel = 64, 64, 3
        ds.PhotometricInterpretation, ds.PlanarConfiguration = "RGB", 0
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        ds.PixelData = text.tobytes()
        ds.save_as(folder / "dose-report.dcm", enforce_file_format=True)

    return make


def _second_series(**options: Any) -> Make:
    """Another CT series in the study beside the lesion's (``options`` for the factory)."""

    def make(folder: Path, files: Files) -> None:
        study_uid = _study_of(files).StudyInstanceUID
        common = {"origin": ORIGIN, "study_uid": study_uid, "extra": {"PatientName": NAME}}
        make_ct_series(folder, **{**GRID, **common, "prefix": "second", **options})

    return make


# --- Enhanced CT ----------------------------------------------------------------------------
def _enhanced(change: Callable[[pydicom.Dataset], None] | None = None, **options: Any) -> Make:
    """The study as one Enhanced CT instance, its functional groups then ``change``d."""

    def make(folder: Path, files: Files) -> None:
        study_uid = _study_of(files).StudyInstanceUID
        for path in files:
            path.unlink()
        path = make_enhanced_series(
            folder,
            n_frames=GRID["n_slices"],
            rows=GRID["rows"],
            cols=GRID["cols"],
            spacing=GRID["spacing"],
            origin=ORIGIN,
            hu=lesion_hu(),
            study_uid=study_uid,
            extra={"PatientName": NAME},
            **options,
        )
        if change is not None:
            ds = pydicom.dcmread(path)
            change(ds)
            ds.save_as(path, enforce_file_format=True)

    return make


def _frame_item(ds: pydicom.Dataset, k: int = 5) -> pydicom.Dataset:
    item: pydicom.Dataset = ds.PerFrameFunctionalGroupsSequence[k]
    return item


def _frame_orientation(ds: pydicom.Dataset) -> None:
    """One frame's own Plane Orientation (coronal) against the shared (axial) one."""
    plane = pydicom.Dataset()
    plane.ImageOrientationPatient = list(CORONAL)
    _frame_item(ds).PlaneOrientationSequence = DicomSequence([plane])


def _frame_without_position(ds: pydicom.Dataset) -> None:
    del _frame_item(ds).PlanePositionSequence


def _frame_spacing(ds: pydicom.Dataset) -> None:
    """One frame's own Pixel Measures (2 mm pixels) against the shared (1 mm) ones."""
    measures = pydicom.Dataset()
    measures.PixelSpacing, measures.SliceThickness = ["2", "2"], "2"
    _frame_item(ds).PixelMeasuresSequence = DicomSequence([measures])


# --- pixel encodings ------------------------------------------------------------------------
def _high_bits_garbage(syntax: str | None = None) -> Make:
    """Bits Stored 12 and the four bits above High Bit set at random (an overlay, or a
    writer that did not clear them), native or compressed losslessly as they are:
    PS3.5 8.1.1 says a reader ignores them."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        noise = np.random.default_rng(k).integers(0, 16, (ds.Rows, ds.Columns), dtype="<u2")
        ds.PixelData = (_pixels(ds) | (noise << 12)).astype("<u2").tobytes()
        if syntax is not None:
            ds.compress(syntax)

    return lambda folder, files: _edit(files, change)


def _corners(ds: pydicom.Dataset) -> np.ndarray:
    """The pixels outside the scanner's circular field of view."""
    rows, cols = np.mgrid[: ds.Rows, : ds.Columns]
    r = (ds.Rows - 1) / 2
    return np.hypot(rows - r, cols - (ds.Columns - 1) / 2) > r


def _padding(value: int, limit: int | None = None) -> Make:
    """Outside the field of view Pixel Padding Value (and up to the Range Limit): stored
    values far from air that must become air, not bright tissue."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        stored = _pixels(ds).copy()
        span = np.arange(value, (limit if limit is not None else value) + 1)
        corners = _corners(ds)
        stored[corners] = np.resize(span, int(corners.sum()))
        ds.PixelData = stored.astype("<u2").tobytes()
        ds.BitsStored, ds.HighBit = 16, 15
        ds.add_new(0x00280120, "US", value)  # Pixel Padding Value
        if limit is not None:
            ds.add_new(0x00280121, "US", limit)  # Pixel Padding Range Limit

    return lambda folder, files: _edit(files, change)


def _signed_hu(declared_signed: bool) -> Make:
    """Stored values that are HU themselves (intercept 0), signed; air outside the field
    of view as padding -2000. Declared unsigned, the negative values read as 63,000+."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        hu = _pixels(ds).astype(np.int32) + int(ds.RescaleIntercept)
        if declared_signed:
            hu[_corners(ds)] = -2000
            ds.add_new(0x00280120, "SS", -2000)
        ds.PixelData = hu.astype("<i2").tobytes()
        ds.PixelRepresentation = 1 if declared_signed else 0
        ds.BitsStored, ds.HighBit, ds.RescaleIntercept = 16, 15, "0"

    return lambda folder, files: _edit(files, change)


def _slope_per_slice(folder: Path, files: Files) -> None:
    """Every other slice stored at half the values with Rescale Slope 2."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        if k % 2:
            ds.PixelData = (_pixels(ds) // 2).astype("<u2").tobytes()
            ds.RescaleSlope = "2"

    _edit(files, change)


def _fragments(how: str) -> Make:
    """Real compressed frames in fragments a decoder must put together: ``split`` (one
    JPEG 2000 codestream in two fragments), ``empty`` (an RLE frame and an empty
    fragment after it), ``extended`` (an RLE frame with an Extended Offset Table)."""

    def change(ds: pydicom.Dataset, k: int) -> None:
        ds.compress(JPEG2000Lossless if how == "split" else RLELossless)
        frame = next(generate_frames(ds.PixelData, number_of_frames=1))
        if how == "split":
            ds.PixelData = encapsulate([frame], fragments_per_frame=2)
        elif how == "empty":
            ds.PixelData = encapsulate([frame]) + b"\xfe\xff\x00\xe0" + bytes(4)  # empty item
        else:
            data, offsets, lengths = encapsulate_extended([frame])
            ds.PixelData = data
            ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths = offsets, lengths
        ds["PixelData"].is_undefined_length = True

    return lambda folder, files: _edit(files, change)


KOREAN = "Hong^Gildong=\x1b$)C\xc8\xab^\xb1\xe6\xb5\xbf".encode("latin-1")  # ISO 2022 IR 149
UTF8_NAME = "Müller^Jürgen=ミュラー^ユルゲン".encode()
LATIN1 = "Müller^Jürgen".encode("latin-1")


def scanner_variants() -> list[Variant]:
    v = Variant
    return [
        # geometry
        v("gantry_tilt", _remade(tilt_deg=15.0), "either"),
        v("sheared_stack", _moved_slice(6, (1.5, 0.0, 0.0)), "either"),
        v(
            "nonuniform_spacing",
            _remade(slice_offsets=[0, 2, 4, 6, 8, 10, 13, 15, 17, 19, 21, 23]),
            "either",
        ),
        v("instances_descending", _remade(order="descending"), "ok"),
        v("instances_shuffled", _remade(order="shuffled", seed=3), "ok"),
        v("localizer_in_series", _localizer_in_series, "ok"),
        v("dose_screenshot_in_series", _dose_screenshot(same_series=True), "ok"),
        v("dose_screenshot_in_study", _dose_screenshot(same_series=False), "ok"),
        v(
            "thicker_series_in_study",  # 4 mm slices without the lesion: the 2 mm one runs
            _second_series(
                n_slices=6,
                spacing=(4.0, 1.0, 1.0),
                hu=lesion_hu((30.0, 30.0, 90.0)),
                series_number=2,
            ),
            "ok",
        ),
        v(
            "derived_tie_in_study",  # an equal DERIVED copy, lower Series Number, lesion elsewhere
            _second_series(
                hu=lesion_hu((30.0, 30.0, 90.0)),
                series_number=0,
                image_type=("DERIVED", "SECONDARY", "AXIAL"),
            ),
            "ok",
        ),
        v(
            "screen_captures_in_study",  # 24 Secondary Capture images, Modality CT, 2 mm
            _second_series(
                n_slices=24,
                hu=lesion_hu((30.0, 30.0, 90.0)),
                series_number=3,
                sop_class_uid=SecondaryCaptureImageStorage,
                image_type=("ORIGINAL", "PRIMARY", "SCREEN SAVE"),
            ),
            "ok",
        ),
        # Enhanced CT
        v("enhanced_ct", _enhanced(), "ok"),
        v("enhanced_ct_frame_orientation", _enhanced(_frame_orientation), "either"),
        v("enhanced_ct_frame_without_position", _enhanced(_frame_without_position), "either"),
        v("enhanced_ct_frame_spacing", _enhanced(_frame_spacing), "either"),
        v(
            "enhanced_ct_rescale_per_frame",
            _enhanced(rescale_per_frame=[(1.0 + k % 2, -1024.0) for k in range(12)]),
            "ok",
        ),
        # pixel encodings
        v("high_bits_garbage", _high_bits_garbage(), "ok"),
        v("high_bits_garbage_rle", _high_bits_garbage(RLELossless), "ok"),
        v("high_bits_garbage_jpeg_ls", _high_bits_garbage(JPEGLSLossless), "ok"),
        v("pixel_padding_value", _padding(63536), "ok"),
        v("pixel_padding_range", _padding(4000, 4095), "ok"),
        v("signed_stored_hu", _signed_hu(declared_signed=True), "ok"),
        v("unsigned_declared_for_signed", _signed_hu(declared_signed=False), "either"),
        v("rescale_slope_per_slice", _slope_per_slice, "ok"),
        v("j2k_two_fragments", _fragments("split"), "ok"),
        v("rle_empty_fragment", _fragments("empty"), "either"),
        v("rle_extended_offset_table", _fragments("extended"), "ok"),
        # character sets
        v("charset_iso2022_ir149", _charset("\\ISO 2022 IR 149", KOREAN), "ok", (KOREAN,)),
        v("charset_utf8", _charset("ISO_IR 192", UTF8_NAME), "ok", (UTF8_NAME, b"M\xc3\xbcller")),
        v("charset_unknown_term", _charset("ISO_IR 999", LATIN1), "ok", (LATIN1,)),
        v("charset_utf8_undeclared", _charset(None, UTF8_NAME), "ok", (UTF8_NAME,)),
    ]
