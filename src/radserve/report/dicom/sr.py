"""The report's measurements as a Comprehensive 3D SR, TID 1500 Measurement Report.

Content tree (highdicom templates):

* observation context: a device observer "radserve" (model name = the pipeline's models
  and versions); procedure reported from the modality;
* one group per organ: volume (ml) and mean (HU, CT only), finding type and site = the
  organ. When a SEG of the organ is given, a Volumetric ROI group (TID 1411) referencing
  the segment; otherwise a plain Measurements group (TID 1501);
* one Volumetric ROI group per finding: tracking identifier ``Lesion n`` + the tracking
  UID its SEG segment carries, finding type, finding site = containing organ, algorithm
  identification, the referenced segment, and measurements volume (ml), long axis and
  short axis (mm; each references the key slice and carries its endpoints as an SCOORD3D
  polyline in the frame of reference) and mean (HU).

Evidence (Current Requested Procedure Evidence) lists every source slice and each SEG.
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
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code
from pydicom.uid import SegmentationStorage

from radserve.domain import Finding, OrganMeasurement
from radserve.errors import ReportError
from radserve.postprocess.diameters import FindingAxes
from radserve.report.dicom import common
from radserve.report.schema import Report

logger = logging.getLogger(__name__)

SegRef = tuple[Dataset, int]  # a SEG dataset and a segment number in it
SegInput = Path | Dataset | Sequence[Path | Dataset] | None


def build_sr(
    report: Report,
    segs: Sequence[Dataset],
    sources: Sequence[Dataset],
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
        groups.append(
            _finding_group(
                report, finding, axes.get(finding.finding_id), ref, sources, warn_missing=bool(segs)
            )
        )
        algorithms.add((finding.model, finding.model_version))
    texts = [common.lesion_name(f.finding_id) for f in report.findings]
    texts += [m.label for m in report.organ_measurements] + [n for pair in algorithms for n in pair]
    texts += common.software_versions(report)
    shielded, patient_name = common.shield_patient_name(sources)
    try:
        content = hd.sr.MeasurementReport(
            observation_context=_observation_context(report),
            procedure_reported=common.procedure_code(report.study.modality),
            imaging_measurements=groups or None,  # type: ignore[arg-type]
        )
        sr = hd.sr.Comprehensive3DSR(
            evidence=[*shielded, *segs],
            content=content[0],
            series_instance_uid=series_instance_uid or common.report_uid(report, "sr-series"),
            series_number=series_number,
            sop_instance_uid=common.report_uid(report, "sr"),
            instance_number=instance_number,
            manufacturer=common.MANUFACTURER,
            is_complete=True,
            is_final=True,
            series_description="radserve AI measurements",
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
    common.restore_patient_name(sr, patient_name)
    common.set_character_set(sr, common.output_character_set(sources[0], texts))
    logger.info("SR built: %d measurement groups, %d SEG referenced", len(groups), len(segs))
    return sr


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
    a SEG, lesion groups are TID 1501 groups that carry the RECIST endpoints instead.
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
def _organ_group(report: Report, organ: OrganMeasurement, ref: SegRef | None) -> object:
    algorithm = hd.sr.AlgorithmIdentification(name=organ.model, version=organ.model_version)
    measurements = [_measurement(codes.SCT.Volume, organ.volume_ml, common.ML, algorithm)]
    if organ.mean_hu is not None and report.study.modality == "CT":
        measurements.append(
            _measurement(codes.SCT.Mean, organ.mean_hu, codes.UCUM.HounsfieldUnit, algorithm)
        )
    common_args = {
        "tracking_identifier": hd.sr.TrackingIdentifier(
            uid=common.tracking_uid(report, _organ_key(organ)),
            identifier=common.lo(organ.label),
        ),
        "finding_type": common.coded(organ.concept),
        "finding_sites": [hd.sr.FindingSite(common.coded(organ.concept))],
        "algorithm_id": algorithm,
        "measurements": measurements,
    }
    if ref is None:
        return hd.sr.MeasurementsAndQualitativeEvaluations(**common_args)
    return hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
        referenced_segment=_referenced_segment(ref), **common_args
    )


def _finding_group(
    report: Report,
    finding: Finding,
    axes: FindingAxes | None,
    ref: SegRef | None,
    sources: Sequence[Dataset],
    *,
    warn_missing: bool,
) -> object:
    algorithm = hd.sr.AlgorithmIdentification(name=finding.model, version=finding.model_version)
    if not 0 <= finding.key_slice_index < len(sources):
        raise ReportError(
            f"finding {finding.finding_id}: key slice {finding.key_slice_index} is outside "
            f"the {len(sources)} source slices"
        )
    key = sources[finding.key_slice_index]
    key_image = hd.sr.SourceImageForMeasurement(str(key.SOPClassUID), str(key.SOPInstanceUID))
    # TID 1411 allows no coordinates on its measurements: the endpoints stay in the JSON
    # report; only the TID 1501 fallback (no segment) carries them as SCOORD3D.
    frame_uid = report.geometry.frame_of_reference_uid if ref is None else None
    long_points = axes.long_axis_lps if axes is not None and frame_uid else None
    short_points = axes.short_axis_lps if axes is not None and frame_uid else None
    measurements = [
        _measurement(codes.SCT.Volume, finding.volume_ml, common.ML, algorithm),
        _measurement(
            codes.SCT.LongAxis,
            finding.longest_diameter_mm,
            codes.UCUM.Millimeter,
            algorithm,
            image=key_image,
            points=long_points,
            frame_uid=frame_uid,
        ),
        _measurement(
            codes.SCT.ShortAxis,
            finding.short_axis_mm,
            codes.UCUM.Millimeter,
            algorithm,
            image=key_image,
            points=short_points,
            frame_uid=frame_uid,
        ),
    ]
    if finding.mean_hu is not None and report.study.modality == "CT":
        measurements.append(
            _measurement(codes.SCT.Mean, finding.mean_hu, codes.UCUM.HounsfieldUnit, algorithm)
        )
    organ = common.organ_concepts(report).get(finding.containing_organ or "")
    args = {
        "tracking_identifier": hd.sr.TrackingIdentifier(
            uid=common.tracking_uid(report, common.finding_key(finding.finding_id)),
            identifier=common.lesion_name(finding.finding_id),
        ),
        "finding_type": common.coded(finding.concept),
        "finding_sites": [hd.sr.FindingSite(common.coded(organ))] if organ else None,
        "algorithm_id": algorithm,
        "measurements": measurements,
    }
    if ref is not None:
        return hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
            referenced_segment=_referenced_segment(ref), **args
        )
    logger.log(
        logging.WARNING if warn_missing else logging.DEBUG,
        "finding %d has no SEG segment; SR group without a region",
        finding.finding_id,
    )
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        source_images=[
            hd.sr.SourceImageForMeasurementGroup(str(key.SOPClassUID), str(key.SOPInstanceUID))
        ],
        **args,
    )


def _measurement(
    name: Code,
    value: float,
    unit: Code,
    algorithm: hd.sr.AlgorithmIdentification,
    *,
    image: hd.sr.SourceImageForMeasurement | None = None,
    points: Sequence[Sequence[float]] | None = None,
    frame_uid: str | None = None,
) -> hd.sr.Measurement:
    coordinates = None
    if points is not None and frame_uid:
        coordinates = [
            hd.sr.CoordinatesForMeasurement3D(
                graphic_type=hd.sr.GraphicTypeValues3D.POLYLINE,
                graphic_data=np.asarray(points, dtype=float),
                frame_of_reference_uid=frame_uid,
            )
        ]
    return hd.sr.Measurement(
        name=name,
        value=round(float(value), 4),
        unit=unit,
        algorithm_id=algorithm,
        referenced_images=[image] if image is not None else None,
        referenced_coordinates=coordinates,
    )


def _referenced_segment(ref: SegRef) -> hd.sr.ReferencedSegment:
    """The segment and the source images of its frames.

    Built here rather than with ``ReferencedSegment.from_segmentation``: highdicom 0.28
    expects the Segment Identification per frame, but puts it in the shared functional
    groups when a SEG has one segment.
    """
    seg, number = ref
    shared = seg.SharedFunctionalGroupsSequence[0].get("SegmentIdentificationSequence")
    images: dict[str, str] = {}
    for frame in seg.get("PerFrameFunctionalGroupsSequence", []):
        ident = frame.get("SegmentIdentificationSequence") or shared
        if not ident or int(ident[0].ReferencedSegmentNumber) != number:
            continue
        for derivation in frame.get("DerivationImageSequence", []):
            for src in derivation.get("SourceImageSequence", []):
                images[str(src.ReferencedSOPInstanceUID)] = str(src.ReferencedSOPClassUID)
    if not images:
        raise ReportError(f"SEG segment {number} has no frames with source image references")
    return hd.sr.ReferencedSegment(
        sop_class_uid=str(seg.SOPClassUID),
        sop_instance_uid=str(seg.SOPInstanceUID),
        segment_number=number,
        source_images=[
            hd.sr.SourceImageForSegmentation(sop_class, uid) for uid, sop_class in images.items()
        ],
    )


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
