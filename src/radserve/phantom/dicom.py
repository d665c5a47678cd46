"""Write a phantom as a CT Image Storage series (one file per slice).

The series is meant to be indistinguishable, for an ingest pipeline, from a real
scanner's: full geometry, patient/study/series identity, contrast, acquisition
attributes, deterministic UIDs, and optional lossless compression. Stored pixels are
unsigned 12-bit (HU + 1024) with Rescale Intercept -1024, the most common CT layout.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    PYDICOM_IMPLEMENTATION_UID,
    CTImageStorage,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
    generate_uid,
)

from radserve.domain.volume import Volume
from radserve.phantom.generate import Phantom, sop_instance_uid

logger = logging.getLogger(__name__)

TransferSyntax = Literal["explicit", "jpeg2000", "rle"]
TRANSFER_SYNTAXES: dict[str, str] = {
    "explicit": ExplicitVRLittleEndian,
    "jpeg2000": JPEG2000Lossless,
    "rle": RLELossless,
}
PRIORITIES = ("STAT", "HIGH", "ROUTINE", "MEDIUM", "LOW")
_INTERCEPT = -1024
_MAX_WORKERS = 4
_J2K_LOCK = threading.Lock()


@dataclass(frozen=True)
class _Identity:
    """Patient, study and series attributes shared by every slice."""

    patient_name: str
    patient_id: str
    birth_date: str
    sex: str
    study_uid: str
    series_uid: str
    study_date: str
    study_time: str
    accession: str
    study_id: str
    priority: str
    charset: str
    salt: str


def _uid(seed: int, *parts: str) -> str:
    return generate_uid(entropy_srcs=["radserve-phantom", str(seed), *parts])


def _identity(
    phantom: Phantom,
    *,
    patient_name: str | None,
    patient_id: str | None,
    priority: str,
    charset: str,
    study_uid: str | None,
) -> _Identity:
    seed = phantom.spec.seed
    rng = np.random.default_rng([seed, 11])
    when = dt.datetime(2024, 1, 1, 7, 0) + dt.timedelta(
        days=int(rng.integers(0, 730)), minutes=int(rng.integers(0, 12 * 60))
    )
    birth = when.date() - dt.timedelta(days=int(rng.integers(25 * 365, 85 * 365)))
    salt = study_uid or ""
    return _Identity(
        patient_name=patient_name if patient_name is not None else f"Phantom^{seed}",
        patient_id=patient_id if patient_id is not None else f"PH{seed:08d}",
        birth_date=birth.strftime("%Y%m%d"),
        sex=str(rng.choice(["F", "M"])),
        study_uid=study_uid or _uid(seed, "study"),
        series_uid=_uid(seed, "series", salt),
        study_date=when.strftime("%Y%m%d"),
        study_time=when.strftime("%H%M%S"),
        accession=f"A{seed:08d}"[:16],
        study_id=str(seed % 10**8),
        priority=priority,
        charset=charset,
        salt=salt,
    )


def _base_dataset(phantom: Phantom, ident: _Identity) -> Dataset:
    """Attributes identical on every slice (a template copied per instance)."""
    spec, ct = phantom.spec, phantom.ct
    ds = Dataset()
    ds.SpecificCharacterSet = ident.charset
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.SOPClassUID = CTImageStorage
    ds.StudyDate = ds.SeriesDate = ds.AcquisitionDate = ds.ContentDate = ident.study_date
    ds.StudyTime = ds.SeriesTime = ds.AcquisitionTime = ds.ContentTime = ident.study_time
    ds.AccessionNumber = ident.accession
    ds.Modality = "CT"
    ds.Manufacturer = "radserve phantom"
    ds.InstitutionName = "radserve"
    ds.ReferringPhysicianName = "Referrer^Phantom"
    ds.StationName = "PHANTOM"
    ds.StudyDescription = "CT chest and upper abdomen with contrast"
    ds.SeriesDescription = "Synthetic CT portal venous"
    ds.ManufacturerModelName = "synthetic CT"
    ds.SoftwareVersions = "radserve"
    ds.PatientName = ident.patient_name
    ds.PatientID = ident.patient_id
    ds.PatientBirthDate = ident.birth_date
    ds.PatientSex = ident.sex
    ds.ContrastBolusAgent = "IV iodinated contrast"
    ds.ContrastBolusRoute = "IV"
    ds.BodyPartExamined = "CHEST"
    ds.ScanOptions = "HELICAL MODE"
    ds.SliceThickness = _ds(spec.slice_thickness_mm)
    ds.KVP = "120"
    ds.SpacingBetweenSlices = _ds(ct.spacing[0])
    ds.DataCollectionDiameter = "500"
    ds.ReconstructionDiameter = _ds(spec.columns * spec.pixel_spacing_mm)
    ds.GantryDetectorTilt = "0"
    ds.TableHeight = _ds(150.0 - spec.patient_offset_mm[1])
    ds.RotationDirection = "CW"
    ds.XRayTubeCurrent = 200
    ds.ConvolutionKernel = "STANDARD"
    ds.PatientPosition = "HFS"
    ds.StudyInstanceUID = ident.study_uid
    ds.SeriesInstanceUID = ident.series_uid
    ds.StudyID = ident.study_id
    ds.SeriesNumber = 2
    ds.AcquisitionNumber = 1
    ds.ImageOrientationPatient = [_ds(v) for v in _orientation(ct.affine)]
    ds.FrameOfReferenceUID = ct.frame_of_reference_uid
    ds.PositionReferenceIndicator = ""
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = spec.rows, spec.columns
    ds.PixelSpacing = [_ds(ct.spacing[1]), _ds(ct.spacing[2])]
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
    ds.PixelRepresentation = 0
    ds.WindowCenter, ds.WindowWidth = "40", "400"
    ds.RescaleIntercept = str(_INTERCEPT)
    ds.RescaleSlope = "1"
    ds.RescaleType = "HU"
    ds.RequestAttributesSequence = DicomSequence([_request_item(ident)])
    ds.RequestedProcedurePriority = ident.priority
    return ds


def _request_item(ident: _Identity) -> Dataset:
    item = Dataset()
    item.AccessionNumber = ident.accession
    item.RequestedProcedureID = f"RP{ident.accession}"[:16]
    item.ScheduledProcedureStepID = f"SPS{ident.accession}"[:16]
    item.RequestedProcedureDescription = "CT chest and upper abdomen with contrast"
    item.RequestedProcedurePriority = ident.priority
    return item


def _ds(value: float) -> str:
    """Decimal String of at most 16 characters."""
    text = f"{value:.6g}"
    return "0" if text in ("-0", "0") else text


def _orientation(affine: np.ndarray) -> list[float]:
    row_dir = affine[:3, 2] / np.linalg.norm(affine[:3, 2])
    col_dir = affine[:3, 1] / np.linalg.norm(affine[:3, 1])
    return [float(round(v, 6)) + 0.0 for v in (*row_dir, *col_dir)]


def _grid(ds: Dataset, volume: Volume) -> None:
    """Set the Image Plane and Image Pixel attributes every slice of ``volume`` shares
    (greyscale, one sample per pixel; positions are per slice)."""
    ds.ImageOrientationPatient = [_ds(v) for v in _orientation(volume.affine)]
    ds.PositionReferenceIndicator = ""
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = volume.shape[1], volume.shape[2]
    ds.PixelSpacing = [_ds(volume.spacing[1]), _ds(volume.spacing[2])]


def _file_meta(sop_class_uid: str, sop_instance_uid: str) -> FileMetaDataset:
    """Part 10 file meta of an Explicit VR Little Endian instance."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class_uid
    meta.MediaStorageSOPInstanceUID = sop_instance_uid
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return meta


def _slice_dataset(
    template: Dataset, phantom: Phantom, ident: _Identity, j: int, syntax: str
) -> Dataset:
    k = phantom.slice_indices[j]
    ds = Dataset()
    ds.update(template)
    ds.SOPInstanceUID = sop_instance_uid(phantom.spec, k, ident.salt)
    ds.InstanceNumber = k + 1
    ipp = phantom.ct.affine[:3, :3] @ np.array([j, 0.0, 0.0]) + phantom.ct.affine[:3, 3]
    ds.ImagePositionPatient = [_ds(v) for v in ipp]
    ds.SliceLocation = _ds(ipp[2])
    stored = (phantom.ct.array[j].astype(np.int32) - _INTERCEPT).astype(np.uint16)
    ds.file_meta = _file_meta(CTImageStorage, ds.SOPInstanceUID)
    if syntax == ExplicitVRLittleEndian:
        ds.PixelData = stored.tobytes()
    elif syntax == JPEG2000Lossless:
        # pylibjpeg-openjpeg 2.6 encode segfaults when called from several threads at
        # once (512x512 frames) and holds the GIL anyway: serialise it.
        with _J2K_LOCK:
            ds.compress(syntax, stored, encoding_plugin="pylibjpeg", generate_instance_uid=False)
    else:
        ds.compress(syntax, stored, encoding_plugin="pylibjpeg", generate_instance_uid=False)
    return ds


def write_dicom_series(
    phantom: Phantom,
    out_dir: str | Path,
    *,
    transfer_syntax: TransferSyntax = "explicit",
    patient_name: str | None = None,
    patient_id: str | None = None,
    priority: str = "ROUTINE",
    specific_character_set: str = "ISO_IR 192",
    study_uid: str | None = None,
    workers: int | None = None,
) -> list[Path]:
    """Write ``phantom.ct`` as CT Image Storage files ``CT0000.dcm``... in ``out_dir``.

    UIDs are deterministic: from the seed, or (for SOP/Series UIDs) from ``study_uid``
    when given, so writing the same phantom into two studies never reuses a UID.
    Without ``study_uid`` the SOP Instance UIDs equal ``phantom.ct.source_sop_instance_uids``.
    ``priority`` goes to Requested Procedure Priority (0040,1003), top level and in the
    Request Attributes Sequence. Returns the paths in slice order (inferior first).
    """
    if transfer_syntax not in TRANSFER_SYNTAXES:
        raise ValueError(
            f"transfer_syntax must be one of {sorted(TRANSFER_SYNTAXES)}, got {transfer_syntax!r}"
        )
    priority = priority.upper()
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
    syntax = TRANSFER_SYNTAXES[transfer_syntax]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ident = _identity(
        phantom,
        patient_name=patient_name,
        patient_id=patient_id,
        priority=priority,
        charset=specific_character_set,
        study_uid=study_uid,
    )
    template = _base_dataset(phantom, ident)
    paths = [out / f"CT{k:04d}.dcm" for k in phantom.slice_indices]

    def write(j: int) -> Path:
        ds = _slice_dataset(template, phantom, ident, j, syntax)
        ds.save_as(paths[j], enforce_file_format=True)
        return paths[j]

    n_workers = workers or min(_MAX_WORKERS, len(paths))
    with ThreadPoolExecutor(max_workers=max(1, n_workers)) as pool:
        list(pool.map(write, range(len(paths))))
    logger.info("wrote %d CT slices (%s)", len(paths), transfer_syntax)
    return paths
