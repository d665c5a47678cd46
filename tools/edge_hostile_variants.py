"""Variants of ``tools/edge_probe.py`` from the hostile-study sweep (session 18): damage
that the other two sets did not try, one kind per variant.

Geometry: one slice's Pixel Spacing or Frame of Reference differs, one slice's position
is NaN, infinite or 1e30, Pixel Spacing negative or zero, a single slice, 2,000 slices of
1 x 1 pixel, two slices of 1 x 65,535. Pixel data: one slice's Pixel Data shorter or
longer than declared, Bits Allocated 12 or 64, Bits Stored above Bits Allocated, Pixel
Representation flipped on one slice, Rescale Slope 1e308, RLE without its sequence
delimiter. Structure: sequences nested 10,000 deep, 100,000 private elements or a 50 MB
text value on one slice, a DICOMDIR beside the images, files without File Meta, an SR
and an RT Structure Set in the CT series.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.fileset import FileSet
from pydicom.uid import ExplicitVRLittleEndian, RLELossless, generate_uid
from tests.factories.dicom_series import make_ct_series
from tests.factories.hostile import nest_sequences, set_raw
from tools.edge_variants import NAME, Files, Variant, _edit, _on_slice

Make = Callable[[Path, Files], None]

SLICE = 6  # the damaged slice of a one-slice variant


def _raw(keyword: str, value: bytes, which: set[int] | None = None) -> Make:
    return lambda folder, files: _edit(files, lambda ds, k: set_raw(ds, keyword, value), which)


def _replace_study(**grid: object) -> Make:
    """The study's files replaced by one series of another grid (same study)."""

    def make(folder: Path, files: Files) -> None:
        study = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
        for path in files:
            path.unlink()
        make_ct_series(folder, study_uid=study, extra={"PatientName": NAME}, **grid)

    return make


def _single_slice(folder: Path, files: Files) -> None:
    for path in files[1:]:
        path.unlink()


def _pixel_data_length(delta: int) -> Make:
    def change(ds: Dataset, k: int) -> None:
        data = ds.PixelData
        ds.PixelData = data[:delta] if delta < 0 else data + bytes(delta)

    return lambda folder, files: _edit(files, change, which={SLICE})


def _bits(allocated: int, stored: int, dtype: str | None) -> Make:
    def change(ds: Dataset, k: int) -> None:
        if dtype is not None:
            ds.PixelData = np.frombuffer(ds.PixelData, "<u2").astype(dtype).tobytes()
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = allocated, stored, stored - 1

    return lambda folder, files: _edit(files, change)


def _rle_without_delimiter(folder: Path, files: Files) -> None:
    _edit(files, lambda ds, k: ds.compress(RLELossless), which={SLICE})
    data = files[SLICE].read_bytes()
    files[SLICE].write_bytes(data[:-8])  # the Sequence Delimitation Item


def _private_elements(count: int) -> Make:
    def change(ds: Dataset, k: int) -> None:
        group, added = 0x0011, 0
        while added < count:
            for creator in range(0x10, 0x100):
                ds.add_new((group << 16) | creator, "LO", f"EDGE{creator}")
                for element in range(min(0x100, count - added)):
                    ds.add_new((group << 16) | (creator << 8) | element, "LO", "x")
                added += min(0x100, count - added)
                if added >= count:
                    return
            group += 2

    return lambda folder, files: _edit(files, change, which={SLICE})


def _long_text(folder: Path, files: Files) -> None:
    # over LT's 10,240 and explicit VR's 64 KB: pydicom writes it as UN (a warning)
    _edit(files, lambda ds, k: setattr(ds, "ImageComments", "x" * (50 << 20)), which={SLICE})


def _dicomdir(folder: Path, files: Files) -> None:
    """A DICOMDIR (Media Storage Directory) listing the study, sent with it."""
    staged = folder.parent / f"{folder.name}-fileset"
    file_set = FileSet()
    for path in files:
        file_set.add(path)
    file_set.write(staged)
    (staged / "DICOMDIR").rename(folder / "DICOMDIR.dcm")


def _without_file_meta(folder: Path, files: Files) -> None:
    for path in files:
        ds = pydicom.dcmread(path)
        ds.file_meta, ds.preamble = FileMetaDataset(), None
        ds.save_as(path, implicit_vr=True, little_endian=True, enforce_file_format=False)


def _not_an_image(sop_class: str) -> Make:
    """An instance of ``sop_class`` (SR, RT Structure Set) in the CT series."""

    def make(folder: Path, files: Files) -> None:
        ct = pydicom.dcmread(files[0], stop_before_pixels=True)
        ds = Dataset()
        for keyword in ("StudyInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID"):
            setattr(ds, keyword, getattr(ct, keyword))
        ds.PatientName, ds.PatientID, ds.Modality = NAME, ct.PatientID, ct.Modality
        ds.SOPClassUID, ds.SOPInstanceUID, ds.InstanceNumber = sop_class, generate_uid(), 99
        ds.file_meta = FileMetaDataset()
        ds.file_meta.MediaStorageSOPClassUID = sop_class
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.save_as(folder / "not-an-image.dcm", enforce_file_format=True)

    return make


def hostile_variants() -> list[Variant]:
    v = Variant
    return [
        v("pixel_spacing_one_slice", _on_slice(SLICE, PixelSpacing=[0.5, 0.5]), "either"),
        v("position_nan_one_slice", _raw("ImagePositionPatient", b"nan\\0\\12", {SLICE}), "refuse"),
        v("position_inf_one_slice", _raw("ImagePositionPatient", b"0\\inf\\12", {SLICE}), "refuse"),
        v(
            "position_1e30_one_slice",
            _raw("ImagePositionPatient", b"0\\0\\1e30", {SLICE}),
            "refuse",
        ),
        v(
            "frame_of_reference_one_slice",
            _on_slice(SLICE, FrameOfReferenceUID=generate_uid()),
            "refuse",
        ),
        v("negative_pixel_spacing", _raw("PixelSpacing", b"-0.7\\0.9"), "refuse"),
        v("zero_pixel_spacing", _raw("PixelSpacing", b"0\\0"), "refuse"),
        v("single_slice", _single_slice, "either"),
        v(
            "slices_2000_of_1x1",
            _replace_study(n_slices=2000, rows=1, cols=1, spacing=(0.5, 1.0, 1.0)),
            "either",
        ),
        v(
            "slices_of_1x65535",
            _replace_study(n_slices=2, rows=1, cols=65535, spacing=(2.0, 0.01, 0.01)),
            "either",
        ),
        v("pixel_data_short_one_slice", _pixel_data_length(-100), "refuse"),
        v("pixel_data_long_one_slice", _pixel_data_length(1000), "either"),
        v("bits_allocated_12", _bits(12, 12, None), "refuse"),
        v("bits_allocated_64", _bits(64, 64, "<u8"), "either"),
        v("bits_stored_over_allocated", _bits(16, 24, None), "refuse"),
        v("pixel_representation_one_slice", _on_slice(SLICE, PixelRepresentation=1), "ok"),
        v("rescale_slope_1e308", _raw("RescaleSlope", b"1e308"), "refuse"),
        v("rle_without_delimiter", _rle_without_delimiter, "refuse"),
        v("nested_sequences_10000", lambda f, s: nest_sequences(s[SLICE], 10_000), "refuse"),
        v("private_elements_100000", _private_elements(100_000), "ok"),
        v("text_value_50mb", _long_text, "either"),
        v("dicomdir_in_study", _dicomdir, "either"),
        v("without_file_meta", _without_file_meta, "either"),
        v("sr_in_series", _not_an_image("1.2.840.10008.5.1.4.1.1.88.33"), "ok"),
        v("rtstruct_in_series", _not_an_image("1.2.840.10008.5.1.4.1.1.481.3"), "ok"),
    ]
