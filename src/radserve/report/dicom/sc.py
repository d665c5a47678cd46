"""Key images as DICOM Secondary Capture, for viewers that cannot show a SEG.

Each PNG key image of the report (the axial slice through a finding, with its outline,
RECIST axes, scale bar and caption burnt in) becomes one RGB Secondary Capture instance
in a third new series of the source study. It references the source slice it was
rendered from (Source Image Sequence; with its frame number in an Enhanced source), so a
viewer can jump to it. Burnt-in text holds
no patient data (finding number, label, sizes, slice number), so Burned In Annotation
is YES without any identifying content.
"""

from __future__ import annotations

import logging
from pathlib import Path

import highdicom as hd
import numpy as np
from PIL import Image
from pydicom.dataset import Dataset

from radserve.domain.volume import Volume
from radserve.errors import ReportError
from radserve.report.dicom import common
from radserve.report.dicom.frames import SliceSources
from radserve.report.keyimages import DisplayTransform
from radserve.report.schema import KeyImageOutput, Report
from radserve.report.shortened import output_character_set

logger = logging.getLogger(__name__)

SC_SERIES_NUMBER = 903
SC_FILE = "keyimage-{n:02d}-sc.dcm"


_OPPOSITE = {"L": "R", "R": "L", "A": "P", "P": "A", "H": "F", "F": "H"}


def patient_orientation(report: Report) -> tuple[str, str]:
    """Patient Orientation (row, column directions) of the key images: the way they
    were drawn (:class:`DisplayTransform` of the input grid), not assumed axial."""
    grid = Volume(
        np.broadcast_to(np.int16(0), tuple(report.geometry.shape)),
        np.asarray(report.geometry.affine, dtype=float),
    )
    t = DisplayTransform.for_volume(grid)
    return _OPPOSITE[t.left], _OPPOSITE[t.top]


def _rgb(path: Path) -> np.ndarray:
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"key image {path.name} cannot be read ({type(exc).__name__})") from exc


def build_key_image_sc(
    report: Report,
    key_image: KeyImageOutput,
    pixels: np.ndarray,
    sources: SliceSources,
    *,
    series_instance_uid: str,
    instance_number: int,
    orientation: tuple[str, str] = ("L", "P"),
) -> Dataset:
    """One RGB Secondary Capture of ``pixels`` (rows, columns, 3; uint8)."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ReportError(f"key image {key_image.path} is not 8-bit RGB")
    if not 0 <= key_image.slice_index < len(sources):
        raise ReportError(f"key image {key_image.path} names slice {key_image.slice_index}")
    source = sources[key_image.slice_index]
    what = f"finding {key_image.finding_id}" if key_image.finding_id else key_image.kind
    character_set = output_character_set(source, [what])
    shielded, patient_name = common.shield_patient_name([source], character_set)
    # highdicom copies and validates the source's character set and refuses valid ISO
    # 2022 terms; the values are decoded text by now, set_character_set encodes them.
    if "SpecificCharacterSet" in shielded[0]:
        del shielded[0].SpecificCharacterSet
    models = sorted({(f.model, f.model_version) for f in report.findings})
    try:
        sc = hd.sc.SCImage.from_ref_dataset(
            ref_dataset=shielded[0],
            pixel_array=pixels,
            photometric_interpretation=hd.PhotometricInterpretationValues.RGB,
            bits_allocated=8,
            coordinate_system=hd.CoordinateSystemNames.PATIENT,
            series_instance_uid=series_instance_uid,
            series_number=common.series_number(SC_SERIES_NUMBER, report),
            sop_instance_uid=common.report_uid(report, "sc", key_image.path),
            instance_number=instance_number,
            manufacturer=common.MANUFACTURER,
            patient_orientation=orientation,
            transfer_syntax_uid="1.2.840.10008.1.2.1",
            contributing_equipment=common.contributing_equipment(report, models, "Key image")
            or None,
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise ReportError(f"Secondary Capture key image could not be built: {exc}") from exc
    common.restore_patient_name(sc, patient_name, character_set)
    sc.SeriesDescription = common.series_description("radserve AI key images", report)
    sc.ImageComments = common.lo(f"radserve key image: {what}")
    sc.BurnedInAnnotation = "YES"
    _copy_laterality(sc, source)
    _copy_study_attributes(sc, shielded[0])  # cut to its VR like the rest
    sc.ImageType = ["DERIVED", "SECONDARY"]
    ref = Dataset()
    ref.ReferencedSOPClassUID = source.SOPClassUID
    ref.ReferencedSOPInstanceUID = source.SOPInstanceUID
    frames = sources.frames_of(key_image.slice_index)
    if frames:  # an Enhanced source: the frame the key image was rendered from
        ref.ReferencedFrameNumber = frames[0]
    sc.SourceImageSequence = [ref]
    sc.DerivationDescription = "Axial source slice with AI finding outline and measurements"
    common.set_character_set(sc, character_set)
    return sc


# Study-level attributes highdicom's SC does not copy from its reference dataset; each
# instance of a study must carry the same Study IE values (dcentvfy compares them).
_STUDY_ATTRIBUTES = ("StudyDescription",)


def _copy_study_attributes(sc: Dataset, source: Dataset) -> None:
    for keyword in _STUDY_ATTRIBUTES:
        if keyword not in sc and source.get(keyword):
            setattr(sc, keyword, source.get(keyword))


def _copy_laterality(sc: Dataset, source: Dataset) -> None:
    """Body part and laterality as the source slice has them.

    Laterality is Type 2C (required for a paired body part without Image Laterality).
    An empty value means "paired, side unknown", so it is written empty only when the
    source names neither its body part nor a side: then that is the truth. Otherwise
    the source's Body Part Examined, Laterality (R/L) and Image Laterality are copied:
    the key image shows the source slice, so it shows the same part and side.
    """
    for keyword in ("BodyPartExamined", "ImageLaterality"):
        value = str(source.get(keyword, "") or "").strip()
        if value and keyword not in sc:
            setattr(sc, keyword, value)
    laterality = str(source.get("Laterality", "") or "").strip().upper()
    if laterality in ("R", "L"):
        sc.Laterality = laterality
    elif "BodyPartExamined" in sc or "ImageLaterality" in sc:
        if "Laterality" in sc:
            del sc.Laterality
    else:
        sc.Laterality = ""


def write_key_image_scs(report: Report, result_dir: Path, sources: SliceSources) -> list[Path]:
    """``keyimage-NN-sc.dcm`` for every key image the report lists, in its order."""
    series_uid = common.report_uid(report, "sc-series")
    orientation = patient_orientation(report)
    written = []
    for n, key_image in enumerate(report.outputs.key_images, start=1):
        pixels = _rgb(Path(result_dir) / key_image.path)
        sc = build_key_image_sc(
            report,
            key_image,
            pixels,
            sources,
            series_instance_uid=series_uid,
            instance_number=n,
            orientation=orientation,
        )
        written.append(common.save_atomic(sc, Path(result_dir) / SC_FILE.format(n=n)))
    logger.info("DICOM results: %d Secondary Capture key image(s)", len(written))
    return written
