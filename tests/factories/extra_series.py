"""Series a modality or PACS sends beside the CT that no pipeline analyses: a localizer,
a screen capture and a radiation dose SR, each in the study of a given CT file."""

from __future__ import annotations

from pathlib import Path

import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from tests.factories.dicom_series import make_ct_series

SECONDARY_CAPTURE = "1.2.840.10008.5.1.4.1.1.7"
DOSE_SR = "1.2.840.10008.5.1.4.1.1.88.67"
SAGITTAL = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)


def _same_study(ct_file: Path) -> dict[str, object]:
    header = pydicom.dcmread(ct_file, stop_before_pixels=True)
    return {"study_uid": header.StudyInstanceUID, "extra": {"PatientID": header.PatientID}}


def localizer(folder: Path, ct_file: Path) -> list[Path]:
    """One sagittal image typed LOCALIZER, series 2."""
    return make_ct_series(
        folder,
        n_slices=1,
        rows=24,
        cols=24,
        orientation=SAGITTAL,
        image_type=("ORIGINAL", "PRIMARY", "LOCALIZER"),
        series_number=2,
        series_description="scout",
        **_same_study(ct_file),  # type: ignore[arg-type]
    )


def screen_capture(folder: Path, ct_file: Path) -> list[Path]:
    """One Secondary Capture image, series 3."""
    return make_ct_series(
        folder,
        n_slices=1,
        sop_class_uid=SECONDARY_CAPTURE,
        modality="OT",
        image_type=("DERIVED", "SECONDARY"),
        series_number=3,
        series_description="screen capture",
        **_same_study(ct_file),  # type: ignore[arg-type]
    )


def dose_report(folder: Path, ct_file: Path) -> Path:
    """An X-Ray Radiation Dose SR, series 999 (a header, no content tree: radserve never
    reads past the header of a class it does not analyse)."""
    study_uid = pydicom.dcmread(ct_file, stop_before_pixels=True).StudyInstanceUID
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = DOSE_SR, generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    sr = Dataset()
    sr.file_meta = meta
    sr.SOPClassUID, sr.SOPInstanceUID = DOSE_SR, meta.MediaStorageSOPInstanceUID
    sr.StudyInstanceUID, sr.SeriesInstanceUID = study_uid, generate_uid()
    sr.Modality, sr.SeriesNumber, sr.InstanceNumber = "SR", 999, 1
    sr.ValueType = "CONTAINER"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dose.dcm"
    sr.save_as(path, enforce_file_format=True)
    return path
