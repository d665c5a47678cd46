"""A PET series over a CT phantom: the same patient and Frame of Reference, known SUVs.

PET/CT models (autoPET-style: CT and PET as two input channels) need a PET whose
standardised uptake values are known exactly. :func:`generate_pet` samples an SUV map
(one SUV per tissue class, every CT lesion made a hot lesion of its own SUV) at the
centres of a coarser PET grid that covers the CT's field of view, in the CT's Frame of
Reference. :func:`write_pet_series` writes it as PET Image Storage the way scanners do:
Units BQML, Decay Correction START (activity decay-corrected to the series start),
one Rescale Slope per slice, and the Radiopharmaceutical Information Sequence (F-18
FDG: injected dose, half-life, injection date/time) plus the Patient's Weight, so SUVbw
follows from the headers by the standard rule (:mod:`radserve.ingest.suv`).

Without ``psf_fwhm_mm`` and ``noise_fraction`` (the defaults) every PET voxel holds the
exact SUV of the tissue at its centre: the truth a converter is tested against.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    PositronEmissionTomographyImageStorage,
)
from scipy.ndimage import gaussian_filter

from radserve.domain.volume import Volume
from radserve.phantom.anatomy import LESION_BASE, Tissue
from radserve.phantom.dicom import _ds, _file_meta, _grid, _identity, _uid
from radserve.phantom.generate import Phantom

logger = logging.getLogger(__name__)

F18_HALF_LIFE_S = 6586.2  # Fluorine-18 (DICOM PS3.16 CID 4020 / NIST): 109.77 min
_STORED_MAX = 32767  # signed 16-bit stored values, one slope per slice

# Background SUVbw per tissue class (typical FDG uptake an hour after injection).
TISSUE_SUV: dict[Tissue, float] = {
    Tissue.AIR: 0.0,
    Tissue.FAT: 0.3,
    Tissue.MUSCLE: 0.8,
    Tissue.SOFT: 0.7,
    Tissue.LUNG: 0.4,
    Tissue.VESSEL: 1.6,
    Tissue.LIVER: 2.2,
    Tissue.SPLEEN: 1.9,
    Tissue.KIDNEY: 3.0,
    Tissue.MYOCARDIUM: 3.5,
    Tissue.BLOOD: 1.6,
    Tissue.AORTA: 1.6,
    Tissue.CANCELLOUS: 1.3,
    Tissue.CORTEX: 0.6,
    Tissue.POSTERIOR: 0.9,
    Tissue.DISC: 0.5,
    Tissue.CANAL: 0.4,
    Tissue.RIB: 0.6,
    Tissue.TABLE_SHELL: 0.0,
    Tissue.TABLE_CORE: 0.0,
}


@dataclass(frozen=True)
class PetSpec:
    """How the PET is acquired; :meth:`for_phantom` draws a plausible one per seed.

    ``uptake_s`` is the time from injection to the PET series start (the decay a
    converter must undo); ``grid_*`` place the PET grid (centred on the CT's field of
    view, same orientation); ``lesion_suv`` is the range hot lesions' SUVs are drawn
    from; ``suv_scale`` multiplies every SUV (a calibration error, for domain grids).
    """

    weight_kg: float
    injected_dose_bq: float
    uptake_s: float
    half_life_s: float = F18_HALF_LIFE_S
    pixel_mm: float = 4.0
    slice_mm: float = 4.0
    lesion_suv: tuple[float, float] = (4.0, 12.0)
    suv_scale: float = 1.0
    psf_fwhm_mm: float = 0.0
    noise_fraction: float = 0.0

    @classmethod
    def for_phantom(cls, seed: int) -> PetSpec:
        rng = np.random.default_rng([seed, 23])
        weight = round(float(rng.uniform(55.0, 100.0)), 1)
        dose = round(weight * float(rng.uniform(3.0, 4.0)) * 1e6, -4)  # 3-4 MBq/kg
        uptake = round(float(rng.uniform(55.0, 75.0)) * 60.0)
        return cls(weight_kg=weight, injected_dose_bq=dose, uptake_s=uptake)

    def decay_factor(self, seconds: float) -> float:
        """Fraction of the activity left after ``seconds``."""
        return float(2.0 ** (-seconds / self.half_life_s))

    def bq_per_ml(self, suv: np.ndarray | float) -> np.ndarray | float:
        """Activity concentration at the series start (decay-corrected START) for ``suv``."""
        dose_at_start = self.injected_dose_bq * self.decay_factor(self.uptake_s)
        return suv * dose_at_start / (self.weight_kg * 1000.0)


@dataclass(frozen=True, eq=False)
class PetPhantom:
    """The PET of a :class:`~radserve.phantom.Phantom`: SUV truth on the PET grid.

    ``suv`` (float32) is in the CT's Frame of Reference; ``lesion_suv`` maps each CT
    lesion id to its SUV; ``lesion_voxels`` counts its PET voxels (a lesion smaller than
    a PET voxel may have none).
    """

    ct: Phantom
    spec: PetSpec
    suv: Volume
    lesion_suv: dict[int, float]
    lesion_voxels: dict[int, int]
    lesions: Volume  # uint16 CT lesion id sampled on the PET grid


def pet_grid(phantom: Phantom, spec: PetSpec) -> Volume:
    """An empty PET grid covering the CT's volume, same axes and Frame of Reference."""
    ct = phantom.ct
    extent = np.array(ct.shape, float) * np.array(ct.spacing)
    spacing = np.array([spec.slice_mm, spec.pixel_mm, spec.pixel_mm])
    shape = np.maximum(1, np.round(extent / spacing)).astype(int)
    centre = ct.index_to_patient((np.array(ct.shape, float) - 1.0) / 2.0)[0]
    direction = ct.direction
    origin = centre - direction @ ((shape - 1.0) / 2.0 * spacing)
    return Volume.from_geometry(
        np.zeros(tuple(shape), np.float32),
        spacing=tuple(spacing),  # type: ignore[arg-type]
        origin=tuple(origin),  # type: ignore[arg-type]
        direction=direction,
        frame_of_reference_uid=ct.frame_of_reference_uid,
    )


def _nearest_ct_indices(ct: Volume, grid: Volume) -> tuple[np.ndarray, ...]:
    """Per axis: the CT index nearest each PET index (-1 where outside the CT)."""
    out = []
    for axis in range(3):
        idx = np.zeros((grid.shape[axis], 3))
        idx[:, axis] = np.arange(grid.shape[axis])
        frac = ct.patient_to_index(grid.index_to_patient(idx))[:, axis]
        near = np.rint(frac).astype(np.int64)
        near[(near < 0) | (near >= ct.shape[axis])] = -1
        out.append(near)
    return tuple(out)


def generate_pet(phantom: Phantom, spec: PetSpec | None = None) -> PetPhantom:
    """The PET of ``phantom`` (a full CT volume): SUV per tissue, hot lesions, on a PET grid."""
    if len(phantom.slice_indices) != phantom.spec.n_slices:
        raise ValueError("generate_pet needs the full CT phantom, not a subset of its slices")
    spec = spec or PetSpec.for_phantom(phantom.spec.seed)
    rng = np.random.default_rng([phantom.spec.seed, 29])
    lesion_suv = {
        les.lesion_id: round(float(rng.uniform(*spec.lesion_suv)), 2) for les in phantom.lesion_list
    }
    table = np.zeros(256, np.float32)
    for tissue, suv in TISSUE_SUV.items():
        table[int(tissue)] = suv
    for lesion_id, suv in lesion_suv.items():
        base = LESION_BASE + 2 * (lesion_id - 1)
        table[base] = table[base + 1] = suv
    grid = pet_grid(phantom, spec)
    iz, iy, ix = _nearest_ct_indices(phantom.ct, grid)
    inside = (iz[:, None, None] >= 0) & (iy[None, :, None] >= 0) & (ix[None, None, :] >= 0)
    tissue = phantom.tissue.array[np.ix_(np.maximum(iz, 0), np.maximum(iy, 0), np.maximum(ix, 0))]
    lesions = phantom.lesions.array[np.ix_(np.maximum(iz, 0), np.maximum(iy, 0), np.maximum(ix, 0))]
    suv = np.where(inside, table[tissue], np.float32(0.0)).astype(np.float32)
    lesions = np.where(inside, lesions, 0).astype(np.uint16)
    suv *= np.float32(spec.suv_scale)
    if spec.psf_fwhm_mm > 0:
        sigma = [spec.psf_fwhm_mm / 2.3548 / s for s in grid.spacing]
        suv = gaussian_filter(suv, sigma, mode="constant").astype(np.float32)
    if spec.noise_fraction > 0:
        noise = np.random.default_rng([phantom.spec.seed, 31]).standard_normal(suv.shape)
        suv = np.maximum(0.0, suv * (1.0 + spec.noise_fraction * noise)).astype(np.float32)
    counts = np.bincount(lesions.ravel(), minlength=max(lesion_suv, default=0) + 1)
    return PetPhantom(
        ct=phantom,
        spec=spec,
        suv=grid.with_array(suv),
        lesion_suv={k: v * spec.suv_scale for k, v in lesion_suv.items()},
        lesion_voxels={k: int(counts[k]) for k in lesion_suv},
        lesions=grid.with_array(lesions),
    )


def with_suv_scale(pet: PetPhantom, scale: float) -> PetPhantom:
    """The same PET with every SUV multiplied by ``scale`` (a calibration shift)."""
    spec = dataclasses.replace(pet.spec, suv_scale=pet.spec.suv_scale * scale)
    return dataclasses.replace(
        pet,
        spec=spec,
        suv=pet.suv.with_array((pet.suv.array * np.float32(scale)).astype(np.float32)),
        lesion_suv={k: v * scale for k, v in pet.lesion_suv.items()},
    )


def _times(study_date: str, study_time: str, uptake_s: float) -> tuple[dt.datetime, dt.datetime]:
    """(injection, PET series start): the PET starts 5 minutes after the CT."""
    ct_start = dt.datetime.strptime(study_date + study_time, "%Y%m%d%H%M%S")
    series = ct_start + dt.timedelta(minutes=5)
    return series - dt.timedelta(seconds=uptake_s), series


def _radiopharmaceutical(spec: PetSpec, injection: dt.datetime) -> Dataset:
    item = Dataset()
    item.Radiopharmaceutical = "Fluorodeoxyglucose"
    item.RadiopharmaceuticalStartTime = injection.strftime("%H%M%S.%f")[:13]
    item.RadiopharmaceuticalStartDateTime = injection.strftime("%Y%m%d%H%M%S.%f")[:21]
    item.RadionuclideTotalDose = _ds(spec.injected_dose_bq)
    item.RadionuclideHalfLife = _ds(spec.half_life_s)
    item.RadionuclidePositronFraction = "0.9673"
    code = Dataset()
    code.CodeValue = "77004003"
    code.CodingSchemeDesignator = "SCT"
    code.CodeMeaning = "^18^Fluorine"
    item.RadionuclideCodeSequence = DicomSequence([code])
    drug = Dataset()
    drug.CodeValue = "35321007"
    drug.CodingSchemeDesignator = "SCT"
    drug.CodeMeaning = "Fluorodeoxyglucose F^18^"
    item.RadiopharmaceuticalCodeSequence = DicomSequence([drug])
    return item


def write_pet_series(
    pet: PetPhantom,
    out_dir: str | Path,
    *,
    patient_name: str | None = None,
    patient_id: str | None = None,
    study_uid: str | None = None,
) -> list[Path]:
    """Write ``pet`` as PET Image Storage files ``PT0000.dcm``... in ``out_dir``.

    Same patient, study and Frame of Reference as the CT written by
    :func:`~radserve.phantom.write_dicom_series` with the same arguments. Stored values
    are signed 16-bit, ``activity = stored x RescaleSlope`` (Bq/ml, one slope per slice).
    """
    ct = pet.ct
    ident = _identity(
        ct,
        patient_name=patient_name,
        patient_id=patient_id,
        priority="ROUTINE",
        charset="ISO_IR 192",
        study_uid=study_uid,
    )
    spec, vol = pet.spec, pet.suv
    injection, series = _times(ident.study_date, ident.study_time, spec.uptake_s)
    activity = np.asarray(spec.bq_per_ml(vol.array.astype(np.float64)))
    seed, salt = ct.spec.seed, ident.salt
    base = Dataset()
    base.SpecificCharacterSet = ident.charset
    base.ImageType = ["ORIGINAL", "PRIMARY"]
    base.SOPClassUID = PositronEmissionTomographyImageStorage
    base.StudyDate, base.StudyTime = ident.study_date, ident.study_time
    base.SeriesDate = base.AcquisitionDate = base.ContentDate = series.strftime("%Y%m%d")
    base.SeriesTime = base.AcquisitionTime = base.ContentTime = series.strftime("%H%M%S")
    base.AccessionNumber = ident.accession
    base.Modality = "PT"
    base.Manufacturer = "radserve phantom"
    base.InstitutionName = "radserve"
    base.ReferringPhysicianName = "Referrer^Phantom"
    base.StudyDescription = "PET/CT whole body FDG"
    base.SeriesDescription = "Synthetic PET AC"
    base.ManufacturerModelName = "synthetic PET"
    base.SoftwareVersions = "radserve"
    base.PatientName, base.PatientID = ident.patient_name, ident.patient_id
    base.PatientBirthDate, base.PatientSex = ident.birth_date, ident.sex
    base.PatientWeight = _ds(spec.weight_kg)
    base.PatientSize = "1.75"
    base.BodyPartExamined = "CHEST"
    base.SliceThickness = _ds(vol.spacing[0])
    base.SpacingBetweenSlices = _ds(vol.spacing[0])
    base.StudyInstanceUID = ident.study_uid
    base.SeriesInstanceUID = _uid(seed, "pet-series", salt)
    base.StudyID = ident.study_id
    base.SeriesNumber = 3
    base.AcquisitionNumber = 1
    base.FrameOfReferenceUID = vol.frame_of_reference_uid
    _grid(base, vol)
    base.BitsAllocated, base.BitsStored, base.HighBit = 16, 16, 15
    base.PixelRepresentation = 1
    base.RescaleIntercept = "0"
    base.Units = "BQML"
    base.CountsSource = "EMISSION"
    base.SeriesType = ["STATIC", "IMAGE"]
    base.CorrectedImage = ["DECY", "ATTN", "SCAT", "DTIM", "RAN", "NORM"]
    base.DecayCorrection = "START"
    base.RandomsCorrectionMethod = "DLYD"
    base.AttenuationCorrectionMethod = "CT-based"
    base.ScatterCorrectionMethod = "model-based"
    base.ReconstructionMethod = "OSEM"
    base.NumberOfSlices = vol.shape[0]
    base.FrameReferenceTime = "0"
    base.ActualFrameDuration = 120000
    base.DecayFactor = "1"
    base.DoseCalibrationFactor = "1"
    base.RadiopharmaceuticalInformationSequence = DicomSequence(
        [_radiopharmaceutical(spec, injection)]
    )
    base.CollimatorType = "NONE"
    base.PatientOrientationCodeSequence = DicomSequence([])
    base.PatientGantryRelationshipCodeSequence = DicomSequence([])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(vol.shape[0]):
        ds = Dataset()
        ds.update(base)
        ds.SOPInstanceUID = _uid(seed, "pet", salt, str(k))
        ds.InstanceNumber = ds.ImageIndex = k + 1
        ipp = vol.index_to_patient(np.array([k, 0.0, 0.0]))[0]
        ds.ImagePositionPatient = [_ds(v) for v in ipp]
        ds.SliceLocation = _ds(ipp[2])
        top = float(activity[k].max())
        slope = top / _STORED_MAX if top > 0 else 1.0
        ds.RescaleSlope = f"{slope:.10g}"[:16]
        slope = float(ds.RescaleSlope)
        stored = np.clip(np.rint(activity[k] / slope), -_STORED_MAX, _STORED_MAX)
        ds.LargestImagePixelValue = int(stored.max())
        ds.SmallestImagePixelValue = int(stored.min())
        ds.file_meta = _file_meta(PositronEmissionTomographyImageStorage, ds.SOPInstanceUID)
        ds.PixelData = stored.astype(np.int16).tobytes()
        path = out / f"PT{k:04d}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    logger.info("wrote %d PET slices", len(paths))
    return paths


def write_pet_ground_truth(pet: PetPhantom, out_dir: str | Path) -> dict[str, Path]:
    """``suv.nii.gz`` (the SUV truth on the PET grid) and ``pet.json`` (acquisition and
    each lesion's SUV) in ``out_dir``."""
    import json

    from radserve.phantom.nifti import write_nifti

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suv = write_nifti(pet.suv, out / "suv.nii.gz")
    info = {
        "spec": dataclasses.asdict(pet.spec),
        "frame_of_reference_uid": pet.suv.frame_of_reference_uid,
        "lesions": [
            {"lesion_id": k, "suv": v, "pet_voxels": pet.lesion_voxels[k]}
            for k, v in sorted(pet.lesion_suv.items())
        ],
    }
    path = out / "pet.json"
    path.write_text(json.dumps(info, indent=2) + "\n")
    return {"suv": suv, "json": path}


__all__ = [
    "F18_HALF_LIFE_S",
    "TISSUE_SUV",
    "PetPhantom",
    "PetSpec",
    "generate_pet",
    "pet_grid",
    "with_suv_scale",
    "write_pet_ground_truth",
    "write_pet_series",
]
