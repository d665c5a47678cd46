"""A multi-sequence MR study over a phantom: T1-, T2- and FLAIR-like series of one anatomy.

Multi-sequence MR models (BraTS-style: T1, T1c, T2, FLAIR as input channels) need several
series of one patient that share a Frame of Reference and a grid, each with its own
contrast. :func:`generate_mr` gives each tissue class of the phantom a signal per
sequence (:data:`SEQUENCES`: fat bright on T1, fluid bright on T2 and dark on FLAIR,
lesions dark on T1 and bright on T2/FLAIR), on the CT's own grid, blurred and with
noise as the CT is. Outside the body the signal is exactly 0, as in skull-stripped
brain MR, so ``NormalizeIntensity(nonzero)`` has a mask to honour.
:func:`write_mr_series` writes one sequence as MR Image Storage (Series Description
``T1 SE AX``, ``T2 TSE AX``, ``T2 FLAIR AX``: what radserve's T1/T2/FLAIR series rules
read), in the CT's Frame of Reference unless told otherwise (a test's unregistered series),
on the CT's grid or on the sequence's own (:mod:`radserve.phantom.mr_grids`: other voxel
sizes, matrix, coverage, a slice gap, a tilt).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset
from pydicom.uid import MRImageStorage
from scipy.ndimage import gaussian_filter

from radserve.domain.volume import Volume
from radserve.phantom.anatomy import LESION_BASE, NON_BODY_TISSUES, Tissue
from radserve.phantom.dicom import _ds, _file_meta, _grid, _Identity, _identity, _uid
from radserve.phantom.generate import Phantom
from radserve.phantom.mr_grids import MrGrid, acquisition_grid, tissue_on_grid

logger = logging.getLogger(__name__)

_STORED_MAX = 4095  # unsigned 12-bit stored values, no rescale (as MR scanners write)


@dataclass(frozen=True)
class MrSequence:
    """One sequence's acquisition attributes and signal per tissue (arbitrary units)."""

    name: str
    description: str
    scanning_sequence: str
    repetition_ms: float
    echo_ms: float
    inversion_ms: float | None
    signal: dict[Tissue, float]
    lesion: float  # solid lesion part
    ground_glass: float


_T1 = {
    Tissue.FAT: 1000, Tissue.MUSCLE: 450, Tissue.SOFT: 500, Tissue.LUNG: 30,
    Tissue.VESSEL: 200, Tissue.LIVER: 600, Tissue.SPLEEN: 450, Tissue.KIDNEY: 500,
    Tissue.MYOCARDIUM: 450, Tissue.BLOOD: 150, Tissue.AORTA: 100, Tissue.CANCELLOUS: 800,
    Tissue.CORTEX: 20, Tissue.POSTERIOR: 700, Tissue.DISC: 350, Tissue.CANAL: 200,
    Tissue.RIB: 300,
}  # fmt: skip
_T2 = {
    Tissue.FAT: 800, Tissue.MUSCLE: 250, Tissue.SOFT: 400, Tissue.LUNG: 20,
    Tissue.VESSEL: 150, Tissue.LIVER: 300, Tissue.SPLEEN: 600, Tissue.KIDNEY: 700,
    Tissue.MYOCARDIUM: 300, Tissue.BLOOD: 500, Tissue.AORTA: 100, Tissue.CANCELLOUS: 600,
    Tissue.CORTEX: 20, Tissue.POSTERIOR: 500, Tissue.DISC: 900, Tissue.CANAL: 1400,
    Tissue.RIB: 200,
}  # fmt: skip
_FLAIR = {
    Tissue.FAT: 600, Tissue.MUSCLE: 250, Tissue.SOFT: 380, Tissue.LUNG: 15,
    Tissue.VESSEL: 100, Tissue.LIVER: 280, Tissue.SPLEEN: 520, Tissue.KIDNEY: 550,
    Tissue.MYOCARDIUM: 290, Tissue.BLOOD: 120, Tissue.AORTA: 60, Tissue.CANCELLOUS: 500,
    Tissue.CORTEX: 20, Tissue.POSTERIOR: 400, Tissue.DISC: 600, Tissue.CANAL: 80,
    Tissue.RIB: 180,
}  # fmt: skip
SEQUENCES: dict[str, MrSequence] = {
    "T1": MrSequence("T1", "T1 SE AX", "SE", 500.0, 12.0, None, _T1, 250.0, 350.0),
    "T2": MrSequence("T2", "T2 TSE AX", "SE", 4000.0, 100.0, None, _T2, 1200.0, 700.0),
    "FLAIR": MrSequence("FLAIR", "T2 FLAIR AX", "IR", 9000.0, 120.0, 2500.0, _FLAIR, 1100.0, 650.0),
}  # fmt: skip
"""The sequences :func:`generate_mr` draws, by name."""


def generate_mr(phantom: Phantom, sequence: str, grid: MrGrid | None = None) -> Volume:
    """``phantom``'s anatomy as ``sequence`` shows it: float32 signal on the CT's grid, or
    on its own acquisition ``grid`` (:mod:`radserve.phantom.mr_grids`)."""
    seq = SEQUENCES[sequence]
    table = np.zeros(256, np.float32)
    for tissue, value in seq.signal.items():
        table[int(tissue)] = value
    for lesion in phantom.lesion_list:
        base = LESION_BASE + 2 * (lesion.lesion_id - 1)
        table[base], table[base + 1] = seq.lesion, seq.ground_glass
    spec = phantom.spec
    if grid is None:
        volume, tissue, thickness = phantom.ct, phantom.tissue.array, spec.slice_thickness_mm
    else:
        volume = acquisition_grid(phantom, grid)
        tissue, thickness = tissue_on_grid(phantom, volume), grid.thickness_mm
    body = ~np.isin(tissue, [int(t) for t in NON_BODY_TISSUES])
    sigma_z = 0.4 * thickness / volume.spacing[0]
    signal = gaussian_filter(table[tissue], (sigma_z, 0.6, 0.6))
    rng = np.random.default_rng([spec.seed, 37, sorted(SEQUENCES).index(sequence)])
    signal += rng.normal(0.0, 15.0, signal.shape).astype(np.float32)
    signal = np.where(body, np.clip(np.rint(signal), 1, _STORED_MAX), 0).astype(np.float32)
    return volume.with_array(signal)


def write_mr_series(
    phantom: Phantom,
    out_dir: str | Path,
    sequence: str,
    *,
    patient_name: str | None = None,
    patient_id: str | None = None,
    study_uid: str | None = None,
    frame_of_reference_uid: str | None = None,
    grid: MrGrid | None = None,
) -> list[Path]:
    """Write ``sequence`` of ``phantom`` as MR Image Storage ``MR-<sequence>-NNNN.dcm``.

    Same patient and study as :func:`~radserve.phantom.write_dicom_series` writes with
    the same arguments; the CT's Frame of Reference unless ``frame_of_reference_uid``;
    the CT's grid unless ``grid`` (e.g. ``VARIED_GRIDS[sequence]``).
    """
    seq = SEQUENCES[sequence]
    volume = generate_mr(phantom, sequence, grid)
    ident = _identity(
        phantom,
        patient_name=patient_name,
        patient_id=patient_id,
        priority="ROUTINE",
        charset="ISO_IR 192",
        study_uid=study_uid,
    )
    base = _base(volume, seq, ident.study_uid, grid or _ct_grid(phantom))
    base.update(_patient(ident))
    base.SeriesInstanceUID = _uid(phantom.spec.seed, f"mr-series-{sequence}", ident.salt)
    base.FrameOfReferenceUID = frame_of_reference_uid or volume.frame_of_reference_uid
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(volume.shape[0]):
        ds = Dataset()
        ds.update(base)
        ds.SOPInstanceUID = _uid(phantom.spec.seed, f"mr-{sequence}", ident.salt, str(k))
        ds.InstanceNumber = k + 1
        ipp = volume.index_to_patient(np.array([k, 0.0, 0.0]))[0]
        ds.ImagePositionPatient = [_ds(v) for v in ipp]
        ds.SliceLocation = _ds(ipp[2])
        ds.file_meta = _file_meta(MRImageStorage, ds.SOPInstanceUID)
        ds.PixelData = volume.array[k].astype(np.uint16).tobytes()
        path = out / f"MR-{sequence}-{k:04d}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    logger.info("wrote %d MR %s slices", len(paths), sequence)
    return paths


def _patient(ident: _Identity) -> Dataset:
    ds = Dataset()
    ds.SpecificCharacterSet = ident.charset
    ds.PatientName, ds.PatientID = ident.patient_name, ident.patient_id
    ds.PatientBirthDate, ds.PatientSex = ident.birth_date, ident.sex
    ds.StudyDate, ds.StudyTime = ident.study_date, ident.study_time
    ds.SeriesDate = ds.AcquisitionDate = ds.ContentDate = ident.study_date
    ds.SeriesTime = ds.AcquisitionTime = ds.ContentTime = ident.study_time
    ds.AccessionNumber = ident.accession
    ds.StudyID = ident.study_id
    return ds


def _ct_grid(phantom: Phantom) -> MrGrid:
    """The CT's own grid, as an :class:`MrGrid` (the slice thickness is what it adds)."""
    ct = phantom.ct
    return MrGrid(ct.spacing[1], ct.spacing[0], phantom.spec.slice_thickness_mm)


def _base(volume: Volume, seq: MrSequence, study_uid: str, grid: MrGrid) -> Dataset:
    """Attributes identical on every slice of one sequence."""
    ds = Dataset()
    ds.ImageType = ["ORIGINAL", "PRIMARY", "M", "ND"]
    ds.SOPClassUID = MRImageStorage
    ds.Modality = "MR"
    ds.Manufacturer = "radserve phantom"
    ds.InstitutionName = "radserve"
    ds.ReferringPhysicianName = "Referrer^Phantom"
    ds.StudyDescription = "MR chest and upper abdomen"
    ds.SeriesDescription = seq.description
    ds.ManufacturerModelName = "synthetic MR"
    ds.SoftwareVersions = "radserve"
    ds.BodyPartExamined = "CHEST"
    ds.ScanningSequence = seq.scanning_sequence
    ds.SequenceVariant = "SK"
    ds.ScanOptions = ""
    ds.MRAcquisitionType = grid.acquisition
    ds.SequenceName = seq.name
    ds.RepetitionTime = _ds(seq.repetition_ms)
    ds.EchoTime = _ds(seq.echo_ms)
    if seq.inversion_ms is not None:
        ds.InversionTime = _ds(seq.inversion_ms)
    ds.EchoTrainLength = 1 if seq.scanning_sequence == "IR" else 16
    ds.MagneticFieldStrength = "1.5"
    ds.ImagedNucleus = "1H"
    ds.SliceThickness = _ds(grid.thickness_mm)
    ds.SpacingBetweenSlices = _ds(volume.spacing[0])
    ds.PatientPosition = "HFS"
    ds.StudyInstanceUID = study_uid
    ds.SeriesNumber = 4 + sorted(SEQUENCES).index(seq.name)
    ds.AcquisitionNumber = 1
    _grid(ds, volume)
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
    ds.PixelRepresentation = 0
    return ds


__all__ = ["SEQUENCES", "MrSequence", "generate_mr", "write_mr_series"]
