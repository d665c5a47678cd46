"""The report's measurements as a Comprehensive 3D SR, TID 1500 Measurement Report.

Content tree (highdicom templates):

* observation context: a device observer "radserve" (model name = the pipeline's models
  and versions); procedure reported from the modality;
* one group per organ: volume (ml) and mean (HU, CT only), finding type and site = the
  organ. When a SEG of the organ is given, a Volumetric ROI group (TID 1411) referencing
  the segment; otherwise a plain Measurements group (TID 1501);
* per finding, two groups with its tracking identifier ``Lesion n`` + the tracking UID
  its SEG segment carries, finding type, finding site = containing organ and algorithm
  identification: a Volumetric ROI group (TID 1411) referencing the segment, with volume
  (ml) and mean (HU), and a TID 1501 group with long and short axis (mm), each
  referencing the key slice and carrying its endpoints as a POLYLINE SCOORD on that
  image and a POLYLINE SCOORD3D in the frame of reference (TID 1411 forbids coordinates
  on its measurements). Without a SEG, one TID 1501 group holds all four. A finding
  that touches an edge of the volume (``coverage`` partial) has, like a partial organ,
  the qualitative evaluation "Quality Issue" = "Anatomy coverage incomplete" in each
  of its groups: its diameters and volume are lower bounds.
* per positive classification (a classification step's class that reached its
  ``min_probability``), a TID 1501 group: tracking identifier ``<step>: <class>``,
  finding type = the class, algorithm identification, and "Probability" (DCM 122157,
  unit UCUM ``1``) = the class's aggregated probability.

A report warning that the study may hold images the result does not cover (late
instances under the gateway's ``flag`` policy, a transfer cut off and never resumed), or
that the models ran on lossy compressed images
(:data:`radserve.report.wording.READER_WARNINGS`), becomes a TEXT "Quality Issue"
(DCM 113010) in TID 1500's Qualitative Evaluations container; each series of the study
that was not analysed (``series_selection.rejected``), a TEXT "Series not analysed"
(99RADSERVE) there: "Series 3 (<Series Instance UID>): <the selection rule's reason>".

Evidence (Current Requested Procedure Evidence) lists every source instance and each SEG.
When the source is an Enhanced (multi-frame) instance, every image reference (key slice,
SCOORD, the segment's source images) names its frame (Referenced Frame Number).
Flags: COMPLETE, UNVERIFIED, and FINAL (the algorithm will not amend it; a radiologist
has not verified it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code
from pydicom.uid import SegmentationStorage

from radserve.domain import Classification, Finding, OrganMeasurement
from radserve.errors import ReportError
from radserve.postprocess.diameters import FindingAxes, Point2, Point3
from radserve.report.dicom import common, notes
from radserve.report.dicom.frames import SliceSources
from radserve.report.schema import Report
from radserve.report.shortened import VALUE_SHORTENED, output_character_set
from radserve.report.wording import reader_notes

logger = logging.getLogger(__name__)

SegRef = tuple[Dataset, int]  # a SEG dataset and a segment number in it
SegInput = Path | Dataset | Sequence[Path | Dataset] | None


def build_sr(
    report: Report,
    segs: Sequence[Dataset],
    sources: SliceSources,
    *,
    series_instance_uid: str | None = None,
    series_number: int = common.SR_SERIES_NUMBER,
    instance_number: int = 1,
) -> hd.sr.Comprehensive3DSR:
    """The SR dataset; ``sources`` are the slice headers in slice order, ``segs`` the SEGs."""
    segments = _segment_index(segs)
    algorithms = {(m.name, m.version) for m in report.models}
    groups: list[object] = [
        _organ_group(report, m, segments.get(common.tracking_uid(report, _organ_key(m))))
        for m in report.organ_measurements
    ]
    axes = {a.finding_id: a for a in report.finding_axes}
    for finding in report.findings:
        ref = segments.get(common.tracking_uid(report, common.finding_key(finding.finding_id)))
        groups.extend(
            _finding_groups(
                report, finding, axes.get(finding.finding_id), ref, sources, warn_missing=bool(segs)
            )
        )
        algorithms.add((finding.model, finding.model_version))
    for classification in report.classifications:
        if classification.positive:
            groups.append(_classification_group(report, classification))
            algorithms.add((classification.model, classification.model_version))
    texts = [common.lesion_name(f.finding_id) for f in report.findings]
    texts += [_class_name(c) for c in report.classifications]
    texts += [m.label for m in report.organ_measurements] + [n for pair in algorithms for n in pair]
    skipped = series_not_analysed(report)
    # the study may hold images this result does not cover (late ones), the images were
    # lossy compressed; a source value this object carries cut: all said as Quality Issues
    issues = reader_notes(report.warnings)
    issues += [w.message for w in report.warnings if w.code == VALUE_SHORTENED]
    texts += common.software_versions(report) + issues + skipped
    character_set = output_character_set(sources[0], texts)
    shielded, patient_name = common.shield_patient_name(sources.instances(), character_set)
    try:
        content = hd.sr.MeasurementReport(
            observation_context=_observation_context(report),
            procedure_reported=common.procedure_code(report.study.modality),
            imaging_measurements=groups or None,  # type: ignore[arg-type]
        )
        evaluations = [notes.text(notes.QUALITY_ISSUE, n) for n in issues]
        # the study may hold images this result does not cover: other series
        evaluations += [notes.text(notes.SERIES_NOT_ANALYSED, n) for n in skipped]
        if evaluations:
            notes.append_to_root(content[0], notes.evaluations(evaluations))
        sr = hd.sr.Comprehensive3DSR(
            evidence=[*shielded, *segs],
            content=content[0],
            series_instance_uid=series_instance_uid or common.report_uid(report, "sr-series"),
            series_number=common.series_number(series_number, report),
            sop_instance_uid=common.report_uid(report, "sr"),
            instance_number=instance_number,
            manufacturer=common.MANUFACTURER,
            is_complete=True,
            is_final=True,
            series_description=common.series_description("radserve AI measurements", report),
            previous_versions=predecessor_documents(report),
            manufacturer_model_name=common.MANUFACTURER,
            software_versions=common.software_versions(report),
            device_serial_number=common.device_serial_number(),
            contributing_equipment=common.contributing_equipment(
                report, sorted(algorithms), "Measurements"
            ),
            specific_character_set=None,  # set below: see common.set_character_set
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise ReportError(f"DICOM SR could not be built: {exc}") from exc
    if skipped:
        notes.declare_scheme(sr)
    common.restore_patient_name(sr, patient_name, character_set)
    common.set_character_set(sr, character_set)
    logger.info("SR built: %d measurement groups, %d SEG referenced", len(groups), len(segs))
    return sr


def series_not_analysed(report: Report) -> list[str]:
    """A line per series of the study not analysed, "Series 3 (<UID>): <reason>": Series
    Number, UID and the selection rule only, never a patient attribute."""
    return [
        f"Series {ref.series_number if ref.series_number is not None else '?'} "
        f"({ref.series_instance_uid}): {ref.reason or 'not selected'}"
        for ref in report.series_selection.rejected
    ]


def write_sr(
    report: Report,
    seg_path_or_dataset: SegInput,
    source_files: Sequence[Path],
    out_path: Path,
    *,
    series_instance_uid: str | None = None,
    series_number: int = common.SR_SERIES_NUMBER,
    instance_number: int = 1,
) -> Path:
    """Write the TID 1500 SR at ``out_path``; SEGs (paths or datasets) may be one, many or none.

    ``source_files`` are the files of the source study (other files are ignored). Without
    a SEG, each lesion is one TID 1501 group (with the RECIST endpoints, as always).
    """
    sources = common.slice_sources(report, common.read_headers(source_files))
    sr = build_sr(
        report,
        _load_segs(seg_path_or_dataset),
        sources,
        series_instance_uid=series_instance_uid,
        series_number=series_number,
        instance_number=instance_number,
    )
    return common.save_atomic(sr, out_path)


# --- groups -----------------------------------------------------------------------------------
# Coverage as qualitative evaluations of the organ's group (name, value). "Finding" is
# taken: TID 1501/1411 name the finding type with it.
NOT_ASSESSED = (codes.DCM.PresenceOfProperty, codes.DCM.PresenceUndetermined)
COVERAGE_INCOMPLETE = (codes.DCM.QualityIssue, Code("130576", "DCM", "Anatomy coverage incomplete"))


def _organ_group(report: Report, organ: OrganMeasurement, ref: SegRef | None) -> object:
    """One organ's group. An organ not found gets no measurement at all (never a 0 ml
    volume) but the evaluation "Presence of property" = "Presence Undetermined" (it may
    lie outside the scanned range); a partial one keeps its volume (a lower bound) with
    "Quality Issue" = "Anatomy coverage incomplete"."""
    algorithm = hd.sr.AlgorithmIdentification(name=organ.model, version=organ.model_version)
    measurements = []
    if organ.volume_ml is not None:
        measurements.append(_measurement(codes.SCT.Volume, organ.volume_ml, common.ML, algorithm))
    if organ.mean_hu is not None and report.study.modality == "CT":
        measurements.append(
            _measurement(codes.SCT.Mean, organ.mean_hu, codes.UCUM.HounsfieldUnit, algorithm)
        )
    evaluation = {"not_found": NOT_ASSESSED, "partial": COVERAGE_INCOMPLETE}.get(organ.coverage)
    common_args = {
        "tracking_identifier": hd.sr.TrackingIdentifier(
            uid=common.tracking_uid(report, _organ_key(organ)),
            identifier=common.lo(organ.label),
        ),
        "finding_type": common.coded(organ.concept),
        "finding_sites": [hd.sr.FindingSite(common.coded(organ.concept))],
        "algorithm_id": algorithm,
        "measurements": measurements or None,
        "qualitative_evaluations": None
        if evaluation is None
        else [hd.sr.QualitativeEvaluation(*evaluation)],
    }
    if ref is None or organ.volume_ml is None:
        return hd.sr.MeasurementsAndQualitativeEvaluations(**common_args)
    return hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
        referenced_segment=_referenced_segment(ref), **common_args
    )


def _finding_groups(
    report: Report,
    finding: Finding,
    axes: FindingAxes | None,
    ref: SegRef | None,
    sources: SliceSources,
    *,
    warn_missing: bool,
) -> list[object]:
    """A lesion's measurement groups, all with its tracking identifier and UID.

    TID 1411 (the SEG segment as its region) forbids coordinates on its measurements,
    so the RECIST axes go into a TID 1501 group of their own, each axis a POLYLINE of
    its two endpoints: as SCOORD on the key slice (what 2-D viewers draw) and as
    SCOORD3D in the frame of reference (the report's LPS endpoints). The volume and
    mean stay with the segment. Without a segment, one TID 1501 group holds them all.
    """
    algorithm = hd.sr.AlgorithmIdentification(name=finding.model, version=finding.model_version)
    if not 0 <= finding.key_slice_index < len(sources):
        raise ReportError(
            f"finding {finding.finding_id}: key slice {finding.key_slice_index} is outside "
            f"the {len(sources)} source slices"
        )
    key = sources[finding.key_slice_index]
    key_frames = sources.frames_of(finding.key_slice_index)  # an Enhanced source's frame
    region_measurements = [_measurement(codes.SCT.Volume, finding.volume_ml, common.ML, algorithm)]
    if finding.mean_hu is not None and report.study.modality == "CT":
        region_measurements.append(
            _measurement(codes.SCT.Mean, finding.mean_hu, codes.UCUM.HounsfieldUnit, algorithm)
        )
    linear = [
        _axis_measurement(
            codes.SCT.LongAxis, finding.longest_diameter_mm, algorithm, key, key_frames,
            report, None if axes is None else (axes.long_axis, axes.long_axis_lps),
        ),
        _axis_measurement(
            codes.SCT.ShortAxis, finding.short_axis_mm, algorithm, key, key_frames,
            report, None if axes is None else (axes.short_axis, axes.short_axis_lps),
        ),
    ]  # fmt: skip
    organ = common.organ_concepts(report).get(finding.containing_organ or "")
    args = {
        "tracking_identifier": hd.sr.TrackingIdentifier(
            uid=common.tracking_uid(report, common.finding_key(finding.finding_id)),
            identifier=common.lesion_name(finding.finding_id),
        ),
        "finding_type": common.coded(finding.concept),
        "finding_sites": [hd.sr.FindingSite(common.coded(organ))] if organ else None,
        "algorithm_id": algorithm,
        # Cut by the edge of the volume: as for a partial organ, "Quality Issue" =
        # "Anatomy coverage incomplete" on every group (its measurements are lower bounds).
        "qualitative_evaluations": [hd.sr.QualitativeEvaluation(*COVERAGE_INCOMPLETE)]
        if finding.coverage == "partial"
        else None,
    }
    key_images = [
        hd.sr.SourceImageForMeasurementGroup(
            str(key.SOPClassUID), str(key.SOPInstanceUID), referenced_frame_numbers=key_frames
        )
    ]
    if ref is not None:
        return [
            hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
                referenced_segment=_referenced_segment(ref),
                measurements=region_measurements,
                **args,
            ),
            hd.sr.MeasurementsAndQualitativeEvaluations(
                source_images=key_images, measurements=linear, **args
            ),
        ]
    logger.log(
        logging.WARNING if warn_missing else logging.DEBUG,
        "finding %d has no SEG segment; SR group without a region",
        finding.finding_id,
    )
    return [
        hd.sr.MeasurementsAndQualitativeEvaluations(
            source_images=key_images,
            measurements=[region_measurements[0], *linear, *region_measurements[1:]],
            **args,
        )
    ]


def _class_name(classification: Classification) -> str:
    return common.lo(f"{classification.step}: {classification.label}")


def _classification_group(report: Report, classification: Classification) -> object:
    """A positive classification as a finding: its class and the class's probability."""
    algorithm = hd.sr.AlgorithmIdentification(
        name=classification.model, version=classification.model_version
    )
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(
            uid=common.tracking_uid(report, common.classification_key(classification.step)),
            identifier=_class_name(classification),
        ),
        finding_type=common.coded(classification.concept),
        algorithm_id=algorithm,
        measurements=[
            _measurement(
                codes.DCM.Probability, classification.probability, codes.UCUM.NoUnits, algorithm
            )
        ],
    )


def _axis_measurement(
    name: Code,
    value: float,
    algorithm: hd.sr.AlgorithmIdentification,
    key: Dataset,
    key_frames: list[int] | None,
    report: Report,
    endpoints: tuple[tuple[Point2, Point2], tuple[Point3, Point3]] | None,
) -> hd.sr.Measurement:
    """A RECIST axis on the key slice: its length, the image (and its frame, in an
    Enhanced source), and its two endpoints.

    Image coordinates are (column, row) with (0, 0) the top left corner of the top left
    pixel (PS3.3 C.18.6.1.2), so a pixel centre at index (r, c) is (c + 0.5, r + 0.5).
    """
    image = hd.sr.SourceImageForMeasurement(
        str(key.SOPClassUID), str(key.SOPInstanceUID), referenced_frame_numbers=key_frames
    )
    coordinates: list[object] = []
    if endpoints is not None:
        rows_cols, lps = endpoints
        xy = np.asarray([(c + 0.5, r + 0.5) for r, c in rows_cols], dtype=float)
        coordinates.append(
            hd.sr.CoordinatesForMeasurement(
                graphic_type=hd.sr.GraphicTypeValues.POLYLINE,
                graphic_data=xy,
                source_image=hd.sr.SourceImageForRegion(
                    str(key.SOPClassUID),
                    str(key.SOPInstanceUID),
                    referenced_frame_numbers=key_frames,
                ),
            )
        )
        frame_uid = report.geometry.frame_of_reference_uid
        if frame_uid:
            coordinates.append(
                hd.sr.CoordinatesForMeasurement3D(
                    graphic_type=hd.sr.GraphicTypeValues3D.POLYLINE,
                    graphic_data=np.asarray(lps, dtype=float),
                    frame_of_reference_uid=frame_uid,
                )
            )
    return hd.sr.Measurement(
        name=name,
        value=round(float(value), 4),
        unit=codes.UCUM.Millimeter,
        algorithm_id=algorithm,
        referenced_images=[image],
        referenced_coordinates=coordinates or None,  # type: ignore[arg-type]
    )


def _measurement(
    name: Code,
    value: float,
    unit: Code,
    algorithm: hd.sr.AlgorithmIdentification,
) -> hd.sr.Measurement:
    return hd.sr.Measurement(
        name=name, value=round(float(value), 4), unit=unit, algorithm_id=algorithm
    )


def _referenced_segment(ref: SegRef) -> hd.sr.ReferencedSegment:
    """The segment and the source images of its frames (with their frame numbers when the
    source is an Enhanced instance).

    Built here rather than with ``ReferencedSegment.from_segmentation``: highdicom 0.28
    expects the Segment Identification per frame, but puts it in the shared functional
    groups when a SEG has one segment.
    """
    seg, number = ref
    shared = seg.SharedFunctionalGroupsSequence[0].get("SegmentIdentificationSequence")
    images: dict[str, tuple[str, set[int]]] = {}  # SOP Instance UID -> class, frames
    for frame in seg.get("PerFrameFunctionalGroupsSequence", []):
        ident = frame.get("SegmentIdentificationSequence") or shared
        if not ident or int(ident[0].ReferencedSegmentNumber) != number:
            continue
        for derivation in frame.get("DerivationImageSequence", []):
            for src in derivation.get("SourceImageSequence", []):
                _, numbers = images.setdefault(
                    str(src.ReferencedSOPInstanceUID), (str(src.ReferencedSOPClassUID), set())
                )
                numbers.update(_frame_numbers(src))
    if not images:
        raise ReportError(f"SEG segment {number} has no frames with source image references")
    return hd.sr.ReferencedSegment(
        sop_class_uid=str(seg.SOPClassUID),
        sop_instance_uid=str(seg.SOPInstanceUID),
        segment_number=number,
        source_images=[
            hd.sr.SourceImageForSegmentation(
                sop_class, uid, referenced_frame_numbers=sorted(numbers) or None
            )
            for uid, (sop_class, numbers) in images.items()
        ],
    )


def _frame_numbers(item: Dataset) -> list[int]:
    """Referenced Frame Number (VM 1-n) of a Source Image Sequence item; [] when absent."""
    value = item.get("ReferencedFrameNumber")
    if value is None or value == "":
        return []
    values = value if isinstance(value, MultiValue) else [value]
    return [int(v) for v in values]


def predecessor_documents(report: Report) -> list[Dataset] | None:
    """The SR this one supersedes (a re-run of the study), as the minimal headers
    highdicom needs for the Predecessor Documents Sequence; None for a first result."""
    lineage = report.lineage
    if lineage is None or lineage.predecessor_sr is None:
        return None
    ref = lineage.predecessor_sr
    previous = Dataset()
    previous.StudyInstanceUID = ref.study_instance_uid
    previous.SeriesInstanceUID = ref.series_instance_uid
    previous.SOPClassUID = ref.sop_class_uid
    previous.SOPInstanceUID = ref.sop_instance_uid
    return [previous]


def _observation_context(report: Report) -> hd.sr.ObservationContext:
    models = ", ".join(f"{m.name} {m.version}" for m in report.models) or report.pipeline.name
    device = hd.sr.DeviceObserverIdentifyingAttributes(
        uid=common.device_uid(),
        name=common.MANUFACTURER,
        manufacturer_name=common.MANUFACTURER,
        model_name=models,
        serial_number=common.device_serial_number(),
    )
    return hd.sr.ObservationContext(
        observer_device_context=hd.sr.ObserverContext(
            observer_type=codes.DCM.Device, observer_identifying_attributes=device
        )
    )


# --- SEG lookup -------------------------------------------------------------------------------
def _organ_key(organ: OrganMeasurement) -> str:
    return common.organ_key(organ.model, organ.label_value)


def _segment_index(segs: Sequence[Dataset]) -> dict[str, SegRef]:
    """Tracking UID -> (SEG, segment number) over all given SEGs."""
    index: dict[str, SegRef] = {}
    for seg in segs:
        for item in seg.get("SegmentSequence", []):
            uid = item.get("TrackingUID")
            if uid:
                index[str(uid)] = (seg, int(item.SegmentNumber))
    return index


def _load_segs(value: SegInput) -> list[Dataset]:
    if value is None:
        return []
    items = [value] if isinstance(value, Path | str | Dataset) else list(value)
    segs = []
    for item in items:
        seg = item if isinstance(item, Dataset) else pydicom.dcmread(item, stop_before_pixels=True)
        if str(seg.get("SOPClassUID", "")) != SegmentationStorage:
            raise ReportError("write_sr expects BINARY Segmentation Storage objects as SEG input")
        segs.append(seg)
    return segs
