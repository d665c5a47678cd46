"""One header-only read per file, turned into typed per-frame records.

A classic single-frame instance gives one :class:`FrameRef`; an enhanced multi-frame
instance gives one per frame, with position, orientation, spacing and rescale taken from
its per-frame functional groups (falling back to the shared groups). Extraction is
lenient: a malformed optional value becomes ``None`` and is judged later, where the
geometry is checked, so one odd tag never hides a whole file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pydicom
from pydicom.dataset import Dataset
from pydicom.uid import UID, ExplicitVRLittleEndian, ImplicitVRLittleEndian

from radserve.ingest.sources import SourceFile, SourceReader

_PREAMBLE = 128
# First tag of a DICOM stream without preamble: group 0002 or 0008, little endian.
_BARE_STREAM_STARTS = (b"\x02\x00", b"\x08\x00")


class SkipFile(Exception):
    """The file is not an image instance; ``reason`` says why (no patient data)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, repr=False)
class PatientInfo:
    """Patient and request attributes that reports need; never logged (repr is redacted)."""

    patient_name: str = ""
    patient_id: str = ""
    patient_birth_date: str = ""
    patient_sex: str = ""
    accession_number: str = ""
    study_date: str = ""
    referring_physician_name: str = ""
    requested_procedure_priority: str = ""
    specific_character_set: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return "PatientInfo(<redacted>)"

    __str__ = __repr__


@dataclass(frozen=True)
class PixelFormat:
    """How stored values are encoded; shared by all frames of one instance."""

    transfer_syntax_uid: str
    rows: int
    columns: int
    samples_per_pixel: int
    photometric_interpretation: str
    bits_allocated: int
    bits_stored: int
    pixel_representation: int
    padding: tuple[int, int] | None = None  # Pixel Padding Value [, Range Limit] (stored)

    @property
    def stored_range(self) -> tuple[int, int]:
        """Smallest and largest storable integer value."""
        bits = self.bits_stored or self.bits_allocated
        if self.pixel_representation == 1:
            return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return 0, 2**bits - 1


@dataclass(frozen=True)
class FrameRef:
    """One 2-D image: a single-frame instance or one frame of a multi-frame instance."""

    source: SourceFile
    frame_index: int | None  # 0-based frame of a multi-frame instance; None if single-frame
    sop_instance_uid: str
    sop_class_uid: str
    pixel: PixelFormat
    position: tuple[float, float, float] | None = None
    orientation: tuple[float, float, float, float, float, float] | None = None
    pixel_spacing: tuple[float, float] | None = None  # (row spacing, column spacing)
    slice_thickness: float | None = None
    spacing_between_slices: float | None = None
    rescale_slope: float = 1.0
    rescale_intercept: float = 0.0
    instance_number: int | None = None
    is_localizer: bool = False
    stack_key: tuple[str, ...] = ()  # temporal position / echo / b-value / stack id


@dataclass(frozen=True)
class InstanceRecord:
    """Series-level attributes of one instance plus its frames."""

    series_instance_uid: str
    study_instance_uid: str
    modality: str
    series_description: str
    series_number: int | None
    body_part_examined: str
    frame_of_reference_uid: str | None
    image_type: tuple[str, ...]
    patient: PatientInfo
    frames: tuple[FrameRef, ...] = field(repr=False)


def read_instance(reader: SourceReader, src: SourceFile) -> InstanceRecord:
    """Header-only read of one file; raises :class:`SkipFile` for anything but an image."""
    with reader.open(src) as fh:
        head = fh.read(_PREAMBLE + 4)
        fh.seek(0)
        if head[_PREAMBLE:] == b"DICM":
            force = False
        elif head[:2] in _BARE_STREAM_STARTS:
            force = True  # legacy file without preamble/meta: still DICOM
        else:
            raise SkipFile("not DICOM (no 'DICM' marker)")
        try:
            ds = pydicom.dcmread(fh, stop_before_pixels=True, force=force)
            return _record(ds, src)
        except SkipFile:
            raise
        except Exception as exc:  # pydicom raises many types on damaged input
            raise SkipFile(f"unreadable DICOM header ({type(exc).__name__})") from exc


def _record(ds: Dataset, src: SourceFile) -> InstanceRecord:
    sop_class = _text(ds, "SOPClassUID")
    series_uid = _text(ds, "SeriesInstanceUID")
    sop_uid = _text(ds, "SOPInstanceUID")
    if not (sop_class and series_uid and sop_uid):
        raise SkipFile("DICOM without SOP Class/SOP Instance/Series Instance UID")
    rows, cols = _int(ds, "Rows"), _int(ds, "Columns")
    if not rows or not cols:
        raise SkipFile(f"not an image ({UID(sop_class).name})")
    pixel = PixelFormat(
        transfer_syntax_uid=_transfer_syntax(ds),
        rows=rows,
        columns=cols,
        samples_per_pixel=_int(ds, "SamplesPerPixel") or 1,
        photometric_interpretation=_text(ds, "PhotometricInterpretation"),
        bits_allocated=_int(ds, "BitsAllocated") or 0,
        bits_stored=_int(ds, "BitsStored") or _int(ds, "BitsAllocated") or 0,
        pixel_representation=_int(ds, "PixelRepresentation") or 0,
        padding=_padding(ds),
    )
    image_type = tuple(str(v).upper() for v in _values(ds, "ImageType"))
    common: dict[str, Any] = {
        "source": src,
        "sop_instance_uid": sop_uid,
        "sop_class_uid": sop_class,
        "pixel": pixel,
        "instance_number": _int(ds, "InstanceNumber"),
    }
    if "PerFrameFunctionalGroupsSequence" in ds or "SharedFunctionalGroupsSequence" in ds:
        frames = _enhanced_frames(ds, common, image_type)
    else:
        frames = _classic_frames(ds, common, image_type)
    return InstanceRecord(
        series_instance_uid=series_uid,
        study_instance_uid=_text(ds, "StudyInstanceUID"),
        modality=_text(ds, "Modality").upper(),
        series_description=_text(ds, "SeriesDescription"),
        series_number=_int(ds, "SeriesNumber"),
        body_part_examined=_text(ds, "BodyPartExamined"),
        frame_of_reference_uid=_text(ds, "FrameOfReferenceUID") or None,
        image_type=image_type,
        patient=_patient(ds),
        frames=frames,
    )


def _classic_frames(
    ds: Dataset, common: dict[str, Any], image_type: tuple[str, ...]
) -> tuple[FrameRef, ...]:
    stack = [
        f"{label}={v}"
        for label, kw in (
            ("temporal", "TemporalPositionIdentifier"),
            ("echo", "EchoNumbers"),
            ("b", "DiffusionBValue"),
        )
        if (v := _text(ds, kw))
    ]
    frame = FrameRef(
        **common,
        frame_index=None,
        position=_floats(ds, "ImagePositionPatient", 3),  # type: ignore[arg-type]
        orientation=_floats(ds, "ImageOrientationPatient", 6),  # type: ignore[arg-type]
        pixel_spacing=_floats(ds, "PixelSpacing", 2),  # type: ignore[arg-type]
        slice_thickness=_float(ds, "SliceThickness"),
        spacing_between_slices=_float(ds, "SpacingBetweenSlices"),
        rescale_slope=_float(ds, "RescaleSlope") or 1.0,
        rescale_intercept=_float(ds, "RescaleIntercept") or 0.0,
        is_localizer="LOCALIZER" in image_type,
        stack_key=tuple(stack),
    )
    n = _int(ds, "NumberOfFrames")
    if n is None:
        return (frame,)
    if n == 1:
        return (replace(frame, frame_index=0),)
    # Multi-frame without functional groups (cine, NM, dose grids): frames have no
    # per-frame position of their own, so geometry is left unknown and judged at load.
    return tuple(replace(frame, frame_index=i, position=None) for i in range(n))


def _enhanced_frames(
    ds: Dataset, common: dict[str, Any], image_type: tuple[str, ...]
) -> tuple[FrameRef, ...]:
    n = _int(ds, "NumberOfFrames") or 1
    shared = _first_item(ds, "SharedFunctionalGroupsSequence") or Dataset()
    per_frame: Sequence[Dataset] = ds.get("PerFrameFunctionalGroupsSequence") or ()
    if per_frame and len(per_frame) != n:
        raise SkipFile(f"{len(per_frame)} per-frame functional groups for {n} frames")
    frames = []
    for i in range(n):
        groups = (per_frame[i] if per_frame else Dataset(), shared)
        fg = partial(_group_item, groups)
        frame_type = _frame_type(groups) or image_type
        stack = [
            f"{label}={_text(item, kw)}"
            for label, seq, kw in (
                ("stack", "FrameContentSequence", "StackID"),
                ("temporal", "FrameContentSequence", "TemporalPositionIndex"),
                ("echo", "MREchoSequence", "EffectiveEchoTime"),
                ("b", "MRDiffusionSequence", "DiffusionBValue"),
            )
            if (item := fg(seq, kw)) is not None and _text(item, kw)
        ]
        measures = fg("PixelMeasuresSequence", "PixelSpacing")
        thickness = fg("PixelMeasuresSequence", "SliceThickness")
        between = fg("PixelMeasuresSequence", "SpacingBetweenSlices")
        position = fg("PlanePositionSequence", "ImagePositionPatient")
        orientation = fg("PlaneOrientationSequence", "ImageOrientationPatient")
        rescale = fg("PixelValueTransformationSequence", "RescaleSlope")
        frames.append(
            FrameRef(
                **common,
                frame_index=i,
                position=_floats(position, "ImagePositionPatient", 3),  # type: ignore[arg-type]
                orientation=_floats(orientation, "ImageOrientationPatient", 6),  # type: ignore[arg-type]
                pixel_spacing=_floats(measures, "PixelSpacing", 2),  # type: ignore[arg-type]
                slice_thickness=_float(thickness, "SliceThickness"),
                spacing_between_slices=_float(between, "SpacingBetweenSlices"),
                rescale_slope=_float(rescale, "RescaleSlope") or _float(ds, "RescaleSlope") or 1.0,
                rescale_intercept=_float(rescale, "RescaleIntercept")
                or _float(ds, "RescaleIntercept")
                or 0.0,
                is_localizer="LOCALIZER" in frame_type,
                stack_key=tuple(stack),
            )
        )
    return tuple(frames)


def _group_item(groups: tuple[Dataset, ...], sequence: str, keyword: str) -> Dataset | None:
    """The functional-group item holding ``keyword``: per-frame first, then shared."""
    for group in groups:
        item = _first_item(group, sequence)
        if item is not None and keyword in item:
            return item
    return None


def _frame_type(groups: tuple[Dataset, ...]) -> tuple[str, ...]:
    for group in groups:
        for sequence in ("CTImageFrameTypeSequence", "MRImageFrameTypeSequence"):
            item = _first_item(group, sequence)
            if item is not None and "FrameType" in item:
                return tuple(str(v).upper() for v in _values(item, "FrameType"))
    return ()


def _patient(ds: Dataset) -> PatientInfo:
    priority = _text(ds, "RequestedProcedurePriority")
    if not priority and (request := _first_item(ds, "RequestAttributesSequence")) is not None:
        priority = _text(request, "RequestedProcedurePriority")
    return PatientInfo(
        patient_name=_text(ds, "PatientName"),
        patient_id=_text(ds, "PatientID"),
        patient_birth_date=_text(ds, "PatientBirthDate"),
        patient_sex=_text(ds, "PatientSex"),
        accession_number=_text(ds, "AccessionNumber"),
        study_date=_text(ds, "StudyDate"),
        referring_physician_name=_text(ds, "ReferringPhysicianName"),
        requested_procedure_priority=priority.upper(),
        specific_character_set=tuple(str(v) for v in _values(ds, "SpecificCharacterSet")),
    )


def _transfer_syntax(ds: Dataset) -> str:
    meta = getattr(ds, "file_meta", None)
    uid = meta.get("TransferSyntaxUID") if meta is not None else None
    if uid:
        return str(uid)
    implicit, _little = ds.original_encoding
    return str(ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian)


def _padding(ds: Dataset) -> tuple[int, int] | None:
    value = _int(ds, "PixelPaddingValue")
    if value is None:
        return None
    limit = _int(ds, "PixelPaddingRangeLimit")
    return (min(value, limit), max(value, limit)) if limit is not None else (value, value)


# --- lenient value access: a malformed optional value is None, never an exception ------------
def _first_item(ds: Dataset | None, keyword: str) -> Dataset | None:
    try:
        seq = ds.get(keyword) if ds is not None else None
        return seq[0] if seq else None
    except Exception:
        return None


def _values(ds: Dataset | None, keyword: str) -> list[Any]:
    try:
        value = ds.get(keyword) if ds is not None else None
    except Exception:
        return []
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, list | tuple | pydicom.multival.MultiValue) else [value]


def _text(ds: Dataset | None, keyword: str) -> str:
    values = _values(ds, keyword)
    return "\\".join(str(v) for v in values).strip() if values else ""


def _float(ds: Dataset | None, keyword: str) -> float | None:
    values = _values(ds, keyword)
    try:
        value = float(values[0]) if len(values) == 1 else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and math.isfinite(value) else None


def _int(ds: Dataset | None, keyword: str) -> int | None:
    value = _float(ds, keyword)
    return int(value) if value is not None else None


def _floats(ds: Dataset | None, keyword: str, count: int) -> tuple[float, ...] | None:
    values = _values(ds, keyword)
    if len(values) != count:
        return None
    try:
        result = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    return result if all(math.isfinite(v) for v in result) else None
