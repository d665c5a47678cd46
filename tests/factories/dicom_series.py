"""Tiny synthetic DICOM series with known geometry, written with pydicom.

Every factory writes files into a folder and returns their paths. Geometry is given
the way the loader should reconstruct it: slice ``k`` (0-based, ascending along the
slice normal = row direction × column direction) sits at
``origin + offset_k · normal (+ tilt shift)``, and ``hu[k]`` is its content in physical
units. ``order`` only changes Instance Numbers and file names (storage order), never
geometry, so a correct loader returns ``hu`` whatever the order.

Defaults are tiny (8 × 16 × 12) with unequal spacings so that swapped axes show up.
The objects carry the attributes loaders need; they are not full IOD-conformant
instances (no dciodvfy promise).

Example::

    paths = make_ct_series(tmp_path, n_slices=5, spacing=(2.5, 0.7, 0.9))
    expected = series_affine(spacing=(2.5, 0.7, 0.9))
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    PYDICOM_IMPLEMENTATION_UID,
    UID,
    CTImageStorage,
    DeflatedExplicitVRLittleEndian,
    EnhancedCTImageStorage,
    EnhancedMRImageStorage,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    MRImageStorage,
    generate_uid,
)

AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
CORONAL = (1.0, 0.0, 0.0, 0.0, 0.0, -1.0)
SAGITTAL = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)
LOCALIZER_IMAGE_TYPE = ("ORIGINAL", "PRIMARY", "LOCALIZER")

HU = np.ndarray | Callable[[np.ndarray], np.ndarray] | None
Order = Literal["ascending", "descending", "shuffled"]

DEFAULT_PATIENT: Mapping[str, str] = {
    "PatientName": "Phantom^Test",
    "PatientID": "PHANTOM-0001",
    "PatientBirthDate": "19700101",
    "PatientSex": "O",
    "AccessionNumber": "ACC0001",
    "StudyDate": "20240102",
    "StudyTime": "101500",
    "ReferringPhysicianName": "Referrer^Dr",
}
_UNCOMPRESSED = {ExplicitVRLittleEndian, ImplicitVRLittleEndian, DeflatedExplicitVRLittleEndian}


# --- geometry helpers ------------------------------------------------------------------------
def oblique_orientation(angle_deg: float = 20.0, axis: Sequence[float] = (1.0, 1.0, 0.0)):
    """An axial orientation rotated by ``angle_deg`` about ``axis`` (6 IOP values)."""
    axis_v = np.asarray(axis, float) / np.linalg.norm(axis)
    a = np.radians(angle_deg)
    k = np.array(
        [[0, -axis_v[2], axis_v[1]], [axis_v[2], 0, -axis_v[0]], [-axis_v[1], axis_v[0], 0]]
    )
    rot = np.eye(3) + np.sin(a) * k + (1 - np.cos(a)) * k @ k
    return tuple(float(v) for v in (*rot @ [1.0, 0, 0], *rot @ [0, 1.0, 0]))


def slice_normal(orientation: Sequence[float]) -> np.ndarray:
    return np.cross(np.asarray(orientation[:3], float), np.asarray(orientation[3:], float))


def series_affine(
    *,
    spacing: Sequence[float] = (2.0, 0.7, 0.9),
    orientation: Sequence[float] = AXIAL,
    origin: Sequence[float] = (0.0, 0.0, 0.0),
) -> np.ndarray:
    """The (slice, row, column) → LPS affine a loader should return for a regular stack."""
    row_dir, col_dir = np.asarray(orientation[:3], float), np.asarray(orientation[3:], float)
    affine = np.eye(4)
    affine[:3, 0] = slice_normal(orientation) * spacing[0]
    affine[:3, 1] = col_dir * spacing[1]  # next row: Pixel Spacing[0] along the column vector
    affine[:3, 2] = row_dir * spacing[2]  # next column: Pixel Spacing[1] along the row vector
    affine[:3, 3] = origin
    return affine


def ramp_hu(n_slices: int, rows: int, cols: int) -> np.ndarray:
    """Distinct value per voxel (for small volumes), so any axis swap or flip is visible."""
    return (np.arange(n_slices * rows * cols).reshape(n_slices, rows, cols) % 3000 - 1000).astype(
        np.float64
    )


def new_uid() -> str:
    return str(generate_uid())


# --- classic single-frame series ---------------------------------------------------------------
def make_ct_series(
    directory: Path,
    *,
    n_slices: int = 8,
    rows: int = 16,
    cols: int = 12,
    spacing: Sequence[float] = (2.0, 0.7, 0.9),
    orientation: Sequence[float] = AXIAL,
    origin: Sequence[float] = (0.0, 0.0, 0.0),
    hu: HU = None,
    slice_offsets: Sequence[float] | None = None,
    tilt_deg: float = 0.0,
    drop: Sequence[int] = (),
    duplicate: Sequence[int] = (),
    duplicate_offset_hu: float = 0.0,
    order: Order = "ascending",
    seed: int = 0,
    modality: str = "CT",
    sop_class_uid: str | None = None,
    rescale: tuple[float, float] = (1.0, -1024.0),
    bits_stored: int = 12,
    signed: bool = False,
    pixel_padding_value: int | None = None,
    image_type: Sequence[str] = ("ORIGINAL", "PRIMARY", "AXIAL"),
    series_uid: str | None = None,
    study_uid: str | None = None,
    frame_of_reference_uid: str | None = None,
    series_number: int = 1,
    series_description: str = "synthetic",
    transfer_syntax: str = ExplicitVRLittleEndian,
    encode_options: Mapping[str, object] | None = None,
    extra: Mapping[str, object] | None = None,
    prefix: str | None = None,
) -> list[Path]:
    """Write a single-frame series; returns the file paths in Instance Number order.

    Args:
        spacing: (slice step, row spacing = Pixel Spacing[0], column spacing =
            Pixel Spacing[1]) in mm.
        hu: physical values (n_slices, rows, cols) in geometric order, or a callable
            mapping LPS points of shape (n, rows, cols, 3) to values; NaN voxels are
            written as ``pixel_padding_value``. Default :func:`ramp_hu`.
        slice_offsets: mm along the normal per slice (default ``k · spacing[0]``); use it
            for non-uniform spacing or duplicates at chosen places.
        tilt_deg: gantry tilt: each slice also moves ``step · tan(tilt)`` along the
            column direction (the first→last vector leaves the normal by ``tilt_deg``).
        drop: slice indices not written (missing slices).
        duplicate: slice indices written twice with new SOP Instance UIDs; the copy gets
            ``duplicate_offset_hu`` added.
        order: Instance Number / file order: ascending (feet→head for axial),
            descending (head→feet) or shuffled.
        transfer_syntax: any syntax pydicom can encode (RLE, JPEG-LS, JPEG 2000 need
            their plugins; JPEG 2000 needs at least 32 × 32 pixels); lossy ones need
            ``encode_options`` such as ``{"j2k_cr": [10]}``. See :func:`dcmtk_compress`.
        extra: further attributes by keyword (e.g. RequestedProcedurePriority).
    """
    directory.mkdir(parents=True, exist_ok=True)
    positions = _positions(n_slices, spacing[0], orientation, origin, slice_offsets, tilt_deg)
    values = _values(hu, positions, rows, cols, spacing, orientation)
    slope, intercept = rescale
    stored = _to_stored(values, slope, intercept, bits_stored, signed, pixel_padding_value)

    slices = [k for k in range(n_slices) if k not in set(drop)]
    copies = [k for k in duplicate if k in slices]
    numbers = _instance_numbers(len(slices), order, seed)
    series_uid = series_uid or new_uid()
    study_uid = study_uid or new_uid()
    frame_uid = frame_of_reference_uid or new_uid()
    sop_class = sop_class_uid or (MRImageStorage if modality == "MR" else CTImageStorage)
    prefix = prefix or f"{modality.lower()}{series_number}"

    written: list[tuple[int, Path]] = []
    jobs = [(k, numbers[i], 0.0) for i, k in enumerate(slices)]
    jobs += [(k, len(slices) + j + 1, duplicate_offset_hu) for j, k in enumerate(copies)]
    for k, number, offset in jobs:
        pixels = stored[k]
        if offset:
            pixels = _to_stored(values[k] + offset, slope, intercept, bits_stored, signed, None)
        ds = _base_dataset(sop_class, modality, series_uid, study_uid, frame_uid, extra)
        ds.SeriesNumber = series_number
        ds.SeriesDescription = series_description
        ds.InstanceNumber = number
        ds.ImageType = list(image_type)
        ds.ImagePositionPatient = [_ds(v) for v in positions[k]]
        ds.ImageOrientationPatient = [_ds(v) for v in orientation]
        ds.PixelSpacing = [_ds(spacing[1]), _ds(spacing[2])]
        ds.SliceThickness = _ds(spacing[0])
        if modality == "CT" or (slope, intercept) != (1.0, 0.0):
            ds.RescaleSlope = _ds(slope)
            ds.RescaleIntercept = _ds(intercept)
            ds.RescaleType = "HU" if modality == "CT" else "US"
        _set_pixels(ds, pixels, bits_stored, signed, pixel_padding_value)
        path = directory / f"{prefix}_{number:04d}.dcm"
        _save(ds, path, transfer_syntax, encode_options)
        written.append((number, path))
    return [p for _, p in sorted(written)]


def make_mr_series(directory: Path, **kwargs: object) -> list[Path]:
    """An MR Image Storage series (no rescale, 12-bit unsigned); same keywords as CT."""
    kwargs.setdefault("rescale", (1.0, 0.0))
    kwargs.setdefault("image_type", ("ORIGINAL", "PRIMARY", "M", "ND"))
    if kwargs.get("hu") is None:
        n, r, c = (kwargs.get(k, d) for k, d in (("n_slices", 8), ("rows", 16), ("cols", 12)))
        kwargs["hu"] = ramp_hu(n, r, c) + 1000.0  # type: ignore[arg-type]
    return make_ct_series(directory, modality="MR", **kwargs)  # type: ignore[arg-type]


def make_localizer(
    directory: Path,
    *,
    series_uid: str,
    study_uid: str | None = None,
    frame_of_reference_uid: str | None = None,
    n_images: int = 1,
    orientation: Sequence[float] = CORONAL,
    rows: int = 16,
    cols: int = 12,
    image_type: Sequence[str] = LOCALIZER_IMAGE_TYPE,
    **kwargs: object,
) -> list[Path]:
    """Scout image(s) in the given series (shares its Series Instance UID)."""
    return make_ct_series(
        directory,
        n_slices=n_images,
        rows=rows,
        cols=cols,
        orientation=orientation,
        image_type=image_type,
        series_uid=series_uid,
        study_uid=study_uid,
        frame_of_reference_uid=frame_of_reference_uid,
        prefix="localizer",
        **kwargs,  # type: ignore[arg-type]
    )


# --- enhanced multi-frame ------------------------------------------------------------------------
def make_enhanced_series(
    directory: Path,
    *,
    n_frames: int = 8,
    rows: int = 16,
    cols: int = 12,
    spacing: Sequence[float] = (2.0, 0.7, 0.9),
    orientation: Sequence[float] = AXIAL,
    origin: Sequence[float] = (0.0, 0.0, 0.0),
    hu: HU = None,
    modality: Literal["CT", "MR"] = "CT",
    rescale: tuple[float, float] | None = None,
    rescale_per_frame: Sequence[tuple[float, float]] | None = None,
    frame_order: Order = "ascending",
    seed: int = 0,
    bits_stored: int = 12,
    signed: bool = False,
    series_uid: str | None = None,
    study_uid: str | None = None,
    frame_of_reference_uid: str | None = None,
    transfer_syntax: str = ExplicitVRLittleEndian,
    extra: Mapping[str, object] | None = None,
    filename: str = "enhanced.dcm",
) -> Path:
    """One Enhanced CT/MR multi-frame instance; geometry only in the functional groups.

    Frame ``i`` of the file holds geometric slice ``perm[i]`` where ``perm`` follows
    ``frame_order``; the default ``hu`` is :func:`ramp_hu` (+1000 for MR);
    ``rescale_per_frame`` (per geometric slice) puts Pixel Value Transformation in the
    per-frame groups instead of the shared ones.
    """
    directory.mkdir(parents=True, exist_ok=True)
    positions = _positions(n_frames, spacing[0], orientation, origin, None, 0.0)
    if hu is None and modality == "MR":
        hu = ramp_hu(n_frames, rows, cols) + 1000.0  # MR values are not negative
    values = _values(hu, positions, rows, cols, spacing, orientation)
    default = (1.0, -1024.0) if modality == "CT" else (1.0, 0.0)
    per_slice = list(rescale_per_frame or [rescale or default] * n_frames)
    stored = np.stack(
        [
            _to_stored(values[k], s, i, bits_stored, signed, None)
            for k, (s, i) in enumerate(per_slice)
        ]
    )
    perm = np.argsort(_instance_numbers(n_frames, frame_order, seed))  # frame -> slice
    sop_class = EnhancedCTImageStorage if modality == "CT" else EnhancedMRImageStorage
    ds = _base_dataset(
        sop_class,
        modality,
        series_uid or new_uid(),
        study_uid or new_uid(),
        frame_of_reference_uid or new_uid(),
        extra,
    )
    ds.SeriesNumber = 1
    ds.InstanceNumber = 1
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL", "NONE"]
    ds.NumberOfFrames = n_frames
    shared = Dataset()
    shared.PixelMeasuresSequence = [_item(PixelSpacing=[_ds(spacing[1]), _ds(spacing[2])])]
    shared.PixelMeasuresSequence[0].SliceThickness = _ds(spacing[0])
    shared.PlaneOrientationSequence = [_item(ImageOrientationPatient=[_ds(v) for v in orientation])]
    if rescale_per_frame is None and (modality == "CT" or rescale):
        shared.PixelValueTransformationSequence = [_rescale_item(*per_slice[0], modality)]
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
    frames = []
    for k in perm:
        item = Dataset()
        item.PlanePositionSequence = [_item(ImagePositionPatient=[_ds(v) for v in positions[k]])]
        item.FrameContentSequence = [_item(StackID="1", InStackPositionNumber=int(k) + 1)]
        if rescale_per_frame is not None:
            item.PixelValueTransformationSequence = [_rescale_item(*per_slice[k], modality)]
        frames.append(item)
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(frames)
    _set_pixels(ds, stored[perm], bits_stored, signed, None)
    path = directory / filename
    _save(ds, path, transfer_syntax)
    return path


def make_legacy_enhanced(files: Sequence[Path], path: Path) -> Path:
    """One Legacy Converted Enhanced CT instance at ``path`` made by highdicom from the
    classic CT ``files`` (as a PACS or converter would): a conformant multi-frame source,
    geometry in its functional groups."""
    import highdicom as hd  # only the tests that convert need it

    image = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=[pydicom.dcmread(f) for f in files],
        series_instance_uid=new_uid(),
        series_number=2,
        sop_instance_uid=new_uid(),
        instance_number=1,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save_as(path)
    return path


# --- other file kinds ----------------------------------------------------------------------------
def write_not_dicom(path: Path, content: bytes = b"this is not a DICOM file\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def truncate(path: Path, keep_fraction: float = 0.6) -> Path:
    """Cut a file short in place (simulates an interrupted transfer)."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    return path


def dcmtk_compress(src: Path, dst: Path, syntax: str) -> Path:
    """Re-encode with dcmtk for syntaxes pydicom cannot encode.

    ``syntax``: ``jpeg-lossless-sv1``, ``jpeg-lossless``, ``jpeg-extended`` (dcmcjpeg),
    ``jpeg-ls`` or ``jpeg-ls-near`` (dcmcjpls, near-lossless with NEAR=2). Raises
    FileNotFoundError when dcmtk is not installed.
    """
    tool, option = {
        "jpeg-lossless-sv1": ("dcmcjpeg", "+e1"),
        "jpeg-lossless": ("dcmcjpeg", "+el"),
        "jpeg-extended": ("dcmcjpeg", "+ee"),
        "jpeg-ls": ("dcmcjpls", "+el"),
        "jpeg-ls-near": ("dcmcjpls", "+en"),
    }[syntax]
    exe = shutil.which(tool)
    if exe is None:
        raise FileNotFoundError(f"{tool} (dcmtk) is not installed")
    subprocess.run([exe, option, str(src), str(dst)], check=True, capture_output=True, timeout=60)
    return dst


# --- internals -----------------------------------------------------------------------------------
def as_jpeg_baseline(paths: Sequence[Path], quality: int) -> None:
    """Rewrite each file as 8-bit JPEG Baseline (Pillow, ``quality``), Rescale Slope 16 and
    no Lossy Image Compression attribute: what some archives send after compressing for
    storage (hostile-input round 5)."""
    import io

    from PIL import Image
    from pydicom.encaps import encapsulate

    for path in paths:
        ds = pydicom.dcmread(path)
        eight = np.clip(np.rint(ds.pixel_array.astype(np.float64) / 16), 0, 255)
        out = io.BytesIO()
        Image.fromarray(eight.astype(np.uint8), mode="L").save(out, format="JPEG", quality=quality)
        ds.PixelData = encapsulate([out.getvalue()])
        ds["PixelData"].VR = "OB"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        ds.RescaleSlope = 16
        ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.50"
        ds.save_as(path, enforce_file_format=True)


def _ds(value: float) -> str:
    """A DS string of at most 16 characters that round-trips closely."""
    text = f"{value:.10g}"
    return text if len(text) <= 16 else f"{value:.8e}"


def _item(**attrs: object) -> Dataset:
    item = Dataset()
    for keyword, value in attrs.items():
        setattr(item, keyword, value)
    return item


def _rescale_item(slope: float, intercept: float, modality: str) -> Dataset:
    return _item(
        RescaleSlope=_ds(slope),
        RescaleIntercept=_ds(intercept),
        RescaleType="HU" if modality == "CT" else "US",
    )


def _positions(
    n: int,
    step: float,
    orientation: Sequence[float],
    origin: Sequence[float],
    offsets: Sequence[float] | None,
    tilt_deg: float,
) -> np.ndarray:
    along = np.asarray(offsets if offsets is not None else np.arange(n) * step, float)
    if len(along) != n:
        raise ValueError(f"{len(along)} slice offsets for {n} slices")
    col_dir = np.asarray(orientation[3:], float)
    shift = along[:, None] * np.tan(np.radians(tilt_deg)) * col_dir[None, :]
    return np.asarray(origin, float) + along[:, None] * slice_normal(orientation) + shift


def _values(
    hu: HU,
    positions: np.ndarray,
    rows: int,
    cols: int,
    spacing: Sequence[float],
    orientation: Sequence[float],
) -> np.ndarray:
    n = len(positions)
    if hu is None:
        return ramp_hu(n, rows, cols)
    if callable(hu):
        row_dir, col_dir = np.asarray(orientation[:3], float), np.asarray(orientation[3:], float)
        r = np.arange(rows)[:, None, None] * spacing[1] * col_dir
        c = np.arange(cols)[None, :, None] * spacing[2] * row_dir
        points = positions[:, None, None, :] + (r + c)[None]
        return np.asarray(hu(points), float)
    values = np.asarray(hu, float)
    if values.shape != (n, rows, cols):
        raise ValueError(f"hu has shape {values.shape}, expected {(n, rows, cols)}")
    return values


def _to_stored(
    values: np.ndarray,
    slope: float,
    intercept: float,
    bits: int,
    signed: bool,
    padding: int | None,
) -> np.ndarray:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    pad = np.isnan(values)
    if pad.any() and padding is None:
        raise ValueError("NaN values need a pixel_padding_value")
    stored = np.rint((np.where(pad, intercept, values) - intercept) / slope)
    if stored.min() < lo or stored.max() > hi:
        raise ValueError(
            f"values need stored range {stored.min()}..{stored.max()}, have {lo}..{hi}"
        )
    stored[pad] = padding if padding is not None else 0
    return stored.astype(np.int16 if signed else np.uint16)


def _instance_numbers(n: int, order: Order, seed: int) -> list[int]:
    """Instance Number for each geometric slice index."""
    if order == "ascending":
        return list(range(1, n + 1))
    if order == "descending":
        return list(range(n, 0, -1))
    return [int(v) + 1 for v in np.random.default_rng(seed).permutation(n)]


def _base_dataset(
    sop_class: str,
    modality: str,
    series_uid: str,
    study_uid: str,
    frame_uid: str,
    extra: Mapping[str, object] | None,
) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = UID(sop_class)
    ds.SOPInstanceUID = new_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.file_meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPClassUID = UID(sop_class)
    ds.SpecificCharacterSet = "ISO_IR 100"
    for keyword, value in DEFAULT_PATIENT.items():
        setattr(ds, keyword, value)
    ds.Modality = modality
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.FrameOfReferenceUID = frame_uid
    ds.StudyID = "1"
    ds.BodyPartExamined = "CHEST"
    for keyword, value in (extra or {}).items():
        setattr(ds, keyword, value)
    return ds


def _set_pixels(
    ds: Dataset, stored: np.ndarray, bits_stored: int, signed: bool, padding: int | None
) -> None:
    ds.Rows, ds.Columns = stored.shape[-2:]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = 16
    ds.BitsStored = bits_stored
    ds.HighBit = bits_stored - 1
    ds.PixelRepresentation = 1 if signed else 0
    if padding is not None:
        ds.PixelPaddingValue = padding
    ds.PixelData = np.ascontiguousarray(stored).astype("<i2" if signed else "<u2").tobytes()


def _save(
    ds: Dataset, path: Path, transfer_syntax: str, options: Mapping[str, object] | None = None
) -> None:
    if transfer_syntax in _UNCOMPRESSED:
        ds.file_meta.TransferSyntaxUID = UID(transfer_syntax)
    else:
        ds.compress(UID(transfer_syntax), **(options or {}))
    ds.save_as(path, enforce_file_format=True)
