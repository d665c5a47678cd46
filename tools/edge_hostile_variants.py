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

Round 3 (session 19): every other slice in another Frame of Reference, turned 90
degrees in its plane (same normal), with other Pixel Spacing or half the matrix; one
Instance Number for every slice, slices 1e-9 or 1e9 mm apart, the Patient ID changing
mid-series, the Study Instance UID equal to the Series Instance UID, UIDs with leading
zeros, 20 Specific Character Set values, a Key Object Selection, a Presentation State
and an Encapsulated PDF in the CT series, JPEG-LS with its codestream cut, encapsulated
frames of 0-byte fragments, an Enhanced CT with one per-frame item fewer or more than
Number of Frames.

Round 5 (session 21): geometry values of the wrong multiplicity or notation (Pixel
Spacing with one or three values or a comma decimal, Image Position with two, Image
Orientation with five, Imager Pixel Spacing instead of Pixel Spacing), Slice Thickness 0
or negative, a Spacing Between Slices that contradicts the positions, no Frame of
Reference UID, a SOP Instance UID equal to the Series or Study Instance UID, a prone
(HFP, the image turned 180 degrees) and a feet-first patient, lossy compression (JPEG
baseline 8-bit, lossy JPEG 2000) and Largest/Smallest Image Pixel Value that lie.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import generate_frames
from pydicom.filebase import DicomBytesIO
from pydicom.fileset import FileSet
from pydicom.filewriter import write_dataset, write_file_meta_info
from pydicom.uid import (
    JPEG2000,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLSLossless,
    RLELossless,
    generate_uid,
)
from tests.factories.dicom_series import make_ct_series
from tests.factories.hostile import nest_sequences, set_raw
from tests.factories.service import GRID, ORIGIN, lesion_hu
from tools.edge_scanner_variants import _enhanced, _second_series
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


# --- round 3 (session 19) --------------------------------------------------------------------
OTHER_PATIENT_ID = "EDGEPROBE-OTHER-PID"  # never logged either
TURNED = (0.0, 1.0, 0.0, -1.0, 0.0, 0.0)  # the axial plane turned 90 degrees: same normal


def _alternate(**values: object) -> Make:
    """``values`` on every other slice (1, 3, 5, ...)."""
    return _on_slice_set(set(range(1, 12, 2)), **values)


def _on_slice_set(which: set[int], **values: object) -> Make:
    def change(ds: Dataset, k: int) -> None:
        for keyword, value in values.items():
            setattr(ds, keyword, value)

    return lambda folder, files: _edit(files, change, which)


def _halved_alternate(folder: Path, files: Files) -> None:
    """Every other slice at half the matrix and twice the pixel size (same extent)."""

    def change(ds: Dataset, k: int) -> None:
        if k % 2:
            half = np.frombuffer(ds.PixelData, "<u2").reshape(ds.Rows, ds.Columns)[::2, ::2]
            ds.Rows, ds.Columns = half.shape
            ds.PixelData = half.tobytes()
            ds.PixelSpacing = [2 * float(v) for v in ds.PixelSpacing]

    _edit(files, change)


def _study_uid_is_series_uid(folder: Path, files: Files) -> None:
    def change(ds: Dataset, k: int) -> None:
        ds.StudyInstanceUID = ds.SeriesInstanceUID

    _edit(files, change)


def _leading_zero_uids(folder: Path, files: Files) -> None:
    """Every UID with a zero-led component (PS3.5 9.1 forbids it; older equipment writes it)."""
    study, series, frame = (f"1.2.826.0.1.3680043.0{k}.{uuid.uuid4().int}"[:64] for k in (1, 2, 3))

    def change(ds: Dataset, k: int) -> None:
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = f"{series[:50]}.00{k + 1}"

    with warnings.catch_warnings():  # pydicom warns of each invalid UI value it is given
        warnings.simplefilter("ignore", UserWarning)
        _edit(files, change)


def _compressed_then(syntax: str, damage: Callable[[bytes], list[bytes]]) -> Make:
    """Each slice compressed in ``syntax``, its frame then re-encapsulated as ``damage``
    makes it (a list of fragments)."""

    def change(ds: Dataset, k: int) -> None:
        ds.compress(syntax)
        frame = next(generate_frames(ds.PixelData, number_of_frames=1))
        items = b"".join(
            b"\xfe\xff\x00\xe0" + len(f).to_bytes(4, "little") + f for f in damage(frame)
        )
        ds.PixelData = b"\xfe\xff\x00\xe0" + bytes(4) + items + b"\xfe\xff\xdd\xe0" + bytes(4)
        ds["PixelData"].is_undefined_length = True

    return lambda folder, files: _edit(files, change)


def _per_frame_items(delta: int) -> Callable[[Dataset], None]:
    """One Per-Frame Functional Groups item fewer (delta -1) or more (+1) than frames."""

    def change(ds: Dataset) -> None:
        items = ds.PerFrameFunctionalGroupsSequence
        if delta < 0:
            del items[-1]
        else:
            items.append(items[-1])

    return change


def _character_sets(count: int) -> Make:
    terms = ["", "ISO 2022 IR 100", "ISO 2022 IR 87", "ISO 2022 IR 149", "ISO 2022 IR 13"]
    values = [terms[k % len(terms)] for k in range(count)]
    return lambda folder, files: _edit(
        files, lambda ds, k: setattr(ds, "SpecificCharacterSet", values)
    )


def round3_variants() -> list[Variant]:
    v = Variant
    other_pid = (OTHER_PATIENT_ID.encode(),)
    return [
        v(
            "frame_of_reference_alternating",
            _alternate(FrameOfReferenceUID=generate_uid()),
            "refuse",
        ),
        v(
            "orientation_turned_alternating",
            _alternate(ImageOrientationPatient=list(TURNED)),
            "either",
        ),
        v("pixel_spacing_alternating", _alternate(PixelSpacing=[0.5, 0.5]), "refuse"),
        v("rows_columns_alternating", _halved_alternate, "refuse"),
        v("instance_number_all_one", _on_slice_set(set(range(12)), InstanceNumber=1), "ok"),
        v(
            "slice_spacing_1e-9",
            _replace_study(n_slices=12, rows=40, cols=40, spacing=(1e-9, 1.0, 1.0)),
            "refuse",
        ),
        v(
            "slice_spacing_1e9",
            _replace_study(n_slices=12, rows=40, cols=40, spacing=(1e9, 1.0, 1.0)),
            "refuse",
        ),
        v(
            "patient_id_changes_mid_series",
            _on_slice_set(set(range(6, 12)), PatientID=OTHER_PATIENT_ID),
            "refuse",
            other_pid,
        ),
        v("study_uid_is_series_uid", _study_uid_is_series_uid, "either"),
        v("uids_with_leading_zeros", _leading_zero_uids, "ok"),
        v("charset_20_values", _character_sets(20), "either"),
        v("kos_in_series", _not_an_image("1.2.840.10008.5.1.4.1.1.88.59"), "ok"),
        v("presentation_state_in_series", _not_an_image("1.2.840.10008.5.1.4.1.1.11.1"), "ok"),
        v("pdf_in_series", _not_an_image("1.2.840.10008.5.1.4.1.1.104.1"), "ok"),
        v(
            "jpegls_cut_codestream",
            _compressed_then(JPEGLSLossless, lambda f: [f[: len(f) // 2]]),
            "refuse",
        ),
        v(
            "rle_zero_byte_fragments",
            _compressed_then(RLELossless, lambda f: [b"", b"", b""]),
            "refuse",
        ),
        v("enhanced_ct_frame_item_missing", _enhanced(_per_frame_items(-1)), "refuse"),
        v("enhanced_ct_frame_item_extra", _enhanced(_per_frame_items(+1)), "either"),
    ]


def _modality_lut(folder: Path, files: Files) -> None:
    """Rescale Slope/Intercept replaced by a Modality LUT Sequence that maps each stored
    value to the same HU (an identity table offset as the rescale was)."""

    def change(ds: Dataset, k: int) -> None:
        slope, intercept = float(ds.RescaleSlope), float(ds.RescaleIntercept)
        del ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType
        item = Dataset()
        item.LUTDescriptor = [4096, 0, 16]
        table = np.arange(4096) * slope + intercept  # signed HU, stored as 16-bit words
        item.add_new(0x00283006, "US", table.astype("<i2").view("<u2").tolist())  # LUT Data
        item.ModalityLUTType = "HU"
        ds.ModalityLUTSequence = [item]

    _edit(files, change)


def _without_rescale(folder: Path, files: Files) -> None:
    def change(ds: Dataset, k: int) -> None:
        del ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType

    _edit(files, change)


def _cropped(rows: int, cols: int, bits: int = 16) -> Make:
    """Each slice cut to ``rows`` x ``cols`` (the lesion stays); ``bits`` 8: stored in
    8 bits with Rescale Slope 16 (an odd pixel count gets its padding byte)."""

    def change(ds: Dataset, k: int) -> None:
        pixels = np.frombuffer(ds.PixelData, "<u2").reshape(ds.Rows, ds.Columns)[:rows, :cols]
        if bits == 8:
            hu = pixels * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
            pixels = np.clip(np.rint((hu + 1024) / 16), 0, 255).astype(np.uint8)
            ds.RescaleSlope, ds.RescaleIntercept = 16, -1024
            ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
        data = np.ascontiguousarray(pixels).tobytes()
        ds.PixelData = data + b"\0" * (len(data) % 2)
        ds.Rows, ds.Columns = rows, cols

    return lambda folder, files: _edit(files, change)


def _series_uid_per_slice(folder: Path, files: Files) -> None:
    _edit(files, lambda ds, k: setattr(ds, "SeriesInstanceUID", generate_uid()))


def _delete(keyword: str) -> Make:
    return lambda folder, files: _edit(files, lambda ds, k: delattr(ds, keyword))


def _slice_removed(folder: Path, files: Files) -> None:
    files[SLICE].unlink()


def _meta_syntax(meta: str, *, implicit: bool = False, compressed: str = "") -> Make:
    """A File Meta whose Transfer Syntax is ``meta`` over a data set encoded otherwise:
    written Implicit VR (``implicit``), or with its pixels compressed in ``compressed``
    (else native, Explicit VR)."""

    def rewrite(folder: Path, files: Files) -> None:
        for path in files:
            ds = pydicom.dcmread(path)
            if compressed:
                ds.compress(compressed)
            body = DicomBytesIO()
            body.is_little_endian, body.is_implicit_VR = True, implicit
            write_dataset(body, ds)
            ds.file_meta.TransferSyntaxUID = meta
            head = DicomBytesIO()
            head.write(b"\0" * 128 + b"DICM")
            write_file_meta_info(head, ds.file_meta, enforce_standard=True)
            path.write_bytes(head.getvalue() + body.getvalue())

    return rewrite


def round4_variants() -> list[Variant]:
    """Session 20: how stored values map to HU, the matrix, the series and instance
    identifiers, and a File Meta that disagrees with the data set."""
    v = Variant
    return [
        v("modality_lut_sequence", _modality_lut, "refuse"),
        v("ct_without_rescale", _without_rescale, "refuse"),
        v("odd_matrix_39x37", _cropped(39, 37), "ok"),
        v("ct_8_bit_odd_matrix", _cropped(39, 37, bits=8), "either"),
        v("series_uid_per_slice", _series_uid_per_slice, "refuse"),
        v("instance_number_absent", _delete("InstanceNumber"), "ok"),
        v("slice_missing_middle", _slice_removed, "refuse"),
        v("sop_class_mr_modality_ct", _on_slice_set(set(range(12)), SOPClassUID=MR), "either"),
        v("modality_mr_sop_class_ct", _on_slice_set(set(range(12)), Modality="MR"), "either"),
        v("meta_explicit_data_implicit", _meta_syntax(EXPLICIT, implicit=True), "either"),
        v("meta_implicit_data_explicit", _meta_syntax(ImplicitVRLittleEndian), "either"),
        v("meta_rle_data_native", _meta_syntax(RLELossless), "refuse"),
        v("meta_native_data_rle", _meta_syntax(EXPLICIT, compressed=RLELossless), "refuse"),
        v("meta_jpegls_data_rle", _meta_syntax(JPEGLSLossless, compressed=RLELossless), "refuse"),
    ]


# --- round 5 (session 21) --------------------------------------------------------------------
def _uid_of_slice(keyword: str) -> Make:
    """Slice SLICE's SOP Instance UID (and its File Meta's) set to its ``keyword`` UID."""

    def change(ds: Dataset, k: int) -> None:
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = getattr(ds, keyword)

    return lambda folder, files: _edit(files, change, which={SLICE})


def _remade(**options: object) -> Make:
    """The study written again (same study, the lesion at the same patient position) with
    ``options`` for the factory: another orientation, origin or pixel grid."""

    def make(folder: Path, files: Files) -> None:
        study = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
        for path in files:
            path.unlink()
        extra = {"PatientName": NAME, **options.get("extra", {})}  # type: ignore[dict-item]
        grid = {**GRID, "origin": ORIGIN, "hu": lesion_hu()}
        grid.update((k, v) for k, v in options.items() if k != "extra")
        make_ct_series(folder, **grid, study_uid=study, extra=extra)  # type: ignore[arg-type]

    return make


# a prone patient (HFP) as a scanner writes it: the image turned 180 degrees in its plane
# (rows run to the patient's right, columns to the anterior), the same field of view
PRONE = {
    "orientation": (-1.0, 0.0, 0.0, 0.0, -1.0, 0.0),
    "origin": (19.5, 19.5, 0.0),
    "extra": {"PatientPosition": "HFP"},
}
# a patient lying on the left side (HFDL): the image turned 90 degrees (rows run to the
# posterior, columns to the patient's right)
DECUBITUS = {
    "orientation": (0.0, 1.0, 0.0, -1.0, 0.0, 0.0),
    "origin": (19.5, -19.5, 0.0),
    "extra": {"PatientPosition": "HFDL"},
}


def _feet_first(folder: Path, files: Files) -> None:
    """Patient Position FFS, slices numbered from the feet (Instance Number 1 highest)."""

    def change(ds: Dataset, k: int) -> None:
        ds.PatientPosition = "FFS"
        ds.InstanceNumber = len(files) - k

    _edit(files, change)


LOSSY = "lossy compressed"  # the report's warning on a lossy study (ingest.validate)


def _jpeg_baseline(quality: int) -> Make:
    """Each slice as 8-bit JPEG baseline (1.2.840.10008.1.2.4.50, Pillow, ``quality``),
    Rescale Slope 16 and Intercept -1024, Lossy Image Compression 01: what a PACS that
    compresses for its archive sends. At quality 75 the test model's lesion came out one
    step smaller (8 of 0.03 ml against 9); at 95 it is the good study's."""
    return lambda folder, files: _edit(files, _jpeg_slice(quality))


def _jpeg_slice(quality: int) -> Callable[[Dataset, int], None]:
    import io

    from PIL import Image
    from pydicom.encaps import encapsulate

    def change(ds: Dataset, k: int) -> None:
        pixels = np.frombuffer(ds.PixelData, "<u2").reshape(ds.Rows, ds.Columns)
        hu = pixels * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        eight = np.clip(np.rint((hu + 1024) / 16), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(eight, mode="L").save(out, format="JPEG", quality=quality)
        ds.PixelData = encapsulate([out.getvalue()])
        ds["PixelData"].VR = "OB"
        ds.RescaleSlope, ds.RescaleIntercept = 16, -1024
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        ds.LossyImageCompression = "01"
        ds.LossyImageCompressionMethod = "ISO_10918_1"
        ratio = 2 * ds.Rows * ds.Columns / len(out.getvalue())  # of the 16-bit original
        ds.LossyImageCompressionRatio = f"{ratio:.2f}"
        ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.50"

    return change


def _j2k_lossy(ratio: int) -> Make:
    """Each slice as lossy JPEG 2000 (1.2.840.10008.1.2.4.91, compression ``ratio``),
    Lossy Image Compression 01. At 10:1 the test model's lesion came out at 5 steps of
    0.03 ml against the good study's 9."""

    def change(ds: Dataset, k: int) -> None:
        ds.compress(JPEG2000, j2k_cr=[ratio])
        ds.LossyImageCompression = "01"
        ds.LossyImageCompressionMethod = "ISO_15444_1"
        ds.LossyImageCompressionRatio = str(ratio)

    return lambda folder, files: _edit(files, change)


def _pixel_value_bounds(folder: Path, files: Files) -> None:
    """Smallest and Largest Image Pixel Value 0 and 1: a header that lies about the data."""

    def change(ds: Dataset, k: int) -> None:
        ds.add_new(0x00280106, "US", 0)  # Smallest Image Pixel Value
        ds.add_new(0x00280107, "US", 1)  # Largest Image Pixel Value

    _edit(files, change)


def _imager_pixel_spacing_only(folder: Path, files: Files) -> None:
    def change(ds: Dataset, k: int) -> None:
        ds.ImagerPixelSpacing = ds.PixelSpacing
        del ds.PixelSpacing

    _edit(files, change)


def _thicker_series_thickness(thickness: str) -> Make:
    """A 4 mm series without the lesion beside the 2 mm one (as the scanner variant
    ``thicker_series_in_study``), its Slice Thickness ``thickness``."""
    second = _second_series(
        n_slices=6, spacing=(4.0, 1.0, 1.0), hu=lesion_hu((30.0, 30.0, 90.0)), series_number=2
    )

    def make(folder: Path, files: Files) -> None:
        second(folder, files)
        thick = sorted(folder.glob("second*.dcm"))
        assert thick, "the second series' files"
        _edit(thick, lambda ds, k: setattr(ds, "SliceThickness", thickness))

    return make


def _negative_slope(folder: Path, files: Files) -> None:
    """Rescale Slope -1: the stored values inverted (4095 - stored, 12 bits) and the
    intercept moved so that every HU is the same."""

    def change(ds: Dataset, k: int) -> None:
        stored = np.frombuffer(ds.PixelData, "<u2").astype(np.int32)
        slope, intercept = float(ds.RescaleSlope), float(ds.RescaleIntercept)
        ds.PixelData = (4095 - stored).astype("<u2").tobytes()
        ds.RescaleSlope, ds.RescaleIntercept = -slope, intercept + 4095 * slope

    _edit(files, change)


def _signed_12_bit_not_extended(syntax: str = "") -> Make:
    """As :func:`_signed_12_bit`, the slices then compressed in ``syntax`` when given
    (pydicom encodes the values it decodes, sign-extended: signed 12-bit data through
    that codec, not the zero upper bits)."""

    def make(folder: Path, files: Files) -> None:
        _signed_12_bit(folder, files)
        if syntax:
            _edit(files, lambda ds, k: ds.compress(syntax))

    return make


def _signed_12_bit(folder: Path, files: Files) -> None:
    """HU stored as 12-bit two's complement (Pixel Representation 1, Bits Stored 12,
    intercept 0) with the upper 4 bits zero, as PS3.5 8.1.1 allows (bits above High Bit
    are not part of the value): -1000 is 0x0C18, which read as 16-bit is +3096."""

    def change(ds: Dataset, k: int) -> None:
        stored = np.frombuffer(ds.PixelData, "<u2").astype(np.int32)
        hu = stored * int(ds.RescaleSlope) + int(ds.RescaleIntercept)
        ds.PixelData = (hu & 0x0FFF).astype("<u2").tobytes()
        ds.PixelRepresentation, ds.BitsStored, ds.HighBit = 1, 12, 11
        ds.RescaleSlope, ds.RescaleIntercept = 1, 0

    _edit(files, change)


def _second_study(keep_sop_uids: bool) -> Make:
    """A second study beside the first: the same images under new Study, Series and
    Frame of Reference UIDs and another Patient ID, their SOP Instance UIDs kept (an
    anonymiser that keeps them; a teaching file of a study the PACS already holds) or
    new (two patients' studies in one upload)."""

    def make(folder: Path, files: Files) -> None:
        study, series, frame = generate_uid(), generate_uid(), generate_uid()
        for path in files:
            ds = pydicom.dcmread(path)
            ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
            ds.FrameOfReferenceUID, ds.PatientID = frame, OTHER_PATIENT_ID
            if not keep_sop_uids:
                ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
            ds.save_as(folder / f"copy-{path.name}", enforce_file_format=True)

    return make


def round5_variants() -> list[Variant]:
    """Session 21: geometry values of the wrong multiplicity or notation, the slice
    thickness and spacing attributes that contradict the positions, UIDs shared across
    levels, patient positions, lossy compression, pixel value bounds that lie."""
    v = Variant
    every = set(range(12))
    return [
        v("pixel_spacing_comma_decimal", _raw("PixelSpacing", b"1,0\\1,0"), "refuse"),
        v("pixel_spacing_one_value", _raw("PixelSpacing", b"1.0"), "refuse"),
        v("pixel_spacing_three_values", _raw("PixelSpacing", b"1.0\\1.0\\1.0"), "refuse"),
        v("imager_pixel_spacing_only", _imager_pixel_spacing_only, "refuse"),
        v("position_two_values", _raw("ImagePositionPatient", b"-19.5\\-19.5"), "refuse"),
        v(
            "orientation_five_values",
            _raw("ImageOrientationPatient", b"1\\0\\0\\0\\1"),
            "refuse",
        ),
        v("slice_thickness_zero", _on_slice_set(every, SliceThickness=0), "ok"),
        v("slice_thickness_negative", _on_slice_set(every, SliceThickness=-2), "ok"),
        v("spacing_between_slices_10", _on_slice_set(every, SpacingBetweenSlices=10), "ok"),
        v("thicker_series_negative_thickness", _thicker_series_thickness("-4"), "ok"),
        v("frame_of_reference_absent", _delete("FrameOfReferenceUID"), "refuse"),
        v("sop_uid_is_series_uid", _uid_of_slice("SeriesInstanceUID"), "either"),
        v("sop_uid_is_study_uid", _uid_of_slice("StudyInstanceUID"), "either"),
        # one job per study at C-STORE and STOW-RS (each succeeds); refused at the form
        # and `radserve run`, which take one study (docs/conformance.md 1.1)
        v(
            "sop_uids_reused_by_another_study",
            _second_study(keep_sop_uids=True),
            "either",
            (OTHER_PATIENT_ID.encode(),),
            agree_except=("cstore", "stow"),
        ),
        v(
            "two_studies_in_one_upload",
            _second_study(keep_sop_uids=False),
            "either",
            (OTHER_PATIENT_ID.encode(),),
            agree_except=("cstore", "stow"),
        ),
        v("patient_prone_hfp", _remade(**PRONE), "ok"),
        v("patient_decubitus_hfdl", _remade(**DECUBITUS), "ok"),
        v("patient_feet_first", _feet_first, "ok"),
        v("lossy_jpeg_baseline", _jpeg_baseline(95), "either", warning=LOSSY),
        v("lossy_jpeg2000", _j2k_lossy(4), "either", warning=LOSSY),
        v("pixel_value_bounds_lie", _pixel_value_bounds, "ok"),
        v("rescale_slope_negative", _negative_slope, "ok"),
        v("signed_12_bit_not_sign_extended", _signed_12_bit_not_extended(), "ok"),
        v("signed_12_bit_rle", _signed_12_bit_not_extended(RLELossless), "ok"),
        v("signed_12_bit_jpegls", _signed_12_bit_not_extended(JPEGLSLossless), "ok"),
        v("signed_12_bit_jpeg2000", _signed_12_bit_not_extended(JPEG2000Lossless), "ok"),
    ]


MR = "1.2.840.10008.5.1.4.1.1.4"  # MR Image Storage
EXPLICIT = ExplicitVRLittleEndian


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
        *round3_variants(),
        *round4_variants(),
        *round5_variants(),
    ]
