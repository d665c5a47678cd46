"""A radserve label map as a BINARY DICOM Segmentation in the source study.

BINARY (Segmentation Storage, 1.2.840.10008.5.1.4.1.1.66.4), never LABELMAP: dcmtk 3.6.7,
dciodvfy 2022 and Orthanc 1.10 do not know the newer SOP class. One segment per described
label value; values are renumbered 1..n in value order (DICOM wants consecutive segment
numbers) and segments with no voxels are left out. Only slices holding a segment become
source frames, and highdicom drops each segment's empty frames, so a 300-slice series
with a small lesion costs a handful of bit-packed frames. An Enhanced (multi-frame)
source is the SEG's one source image, its frames referenced by number
(:mod:`radserve.report.dicom.frames`).

Each segment carries the model as Segmentation Algorithm Identification, a tracking ID
(``Lesion 3`` or the organ label) and a tracking UID that the SR writer derives the same
way (:func:`~radserve.report.dicom.common.tracking_uid`), so SR groups and segments match.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes

from radserve.domain import CodedConcept, Volume
from radserve.errors import ReportError
from radserve.ingest.headers import lossy_compression
from radserve.report.dicom import common, frames
from radserve.report.dicom.frames import SliceSources
from radserve.report.schema import Report, Segment
from radserve.report.shortened import output_character_set

logger = logging.getLogger(__name__)

_CONTENT_LABEL = {"findings": "FINDINGS", "organs": "ORGANS", "structures": "STRUCTURES"}


def segment_key(segment: Segment) -> str:
    """What ties a segment to its SR group: the finding id, or the organ's model and value."""
    if segment.finding_id is not None:
        return common.finding_key(segment.finding_id)
    return common.organ_key(segment.model, segment.value)


def build_seg(
    report: Report,
    label_map: Volume,
    segments: Sequence[Segment],
    sources: SliceSources,
    *,
    series_instance_uid: str | None = None,
    series_number: int = common.SEG_SERIES_NUMBER,
    instance_number: int = 1,
    name: str | None = None,
    renumber_in_place: bool = False,
) -> hd.seg.Segmentation:
    """The Segmentation dataset; ``sources`` are the slice headers in slice order.

    Single-frame sources: the slab's instances are the source images, one a frame. An
    Enhanced source: the instance is the one source image and each SEG frame carries its
    source frame's own plane position, which highdicom matches to that frame number.

    ``name`` (the label map's file stem) keeps the SOP Instance UIDs of two label maps of
    one kind apart; the reference pipeline's ``organs`` / ``findings`` maps keep theirs.

    ``renumber_in_place``: the label map's array is the caller's to discard (read for
    this SEG alone), so values that need renumbering are renumbered in it, plane by
    plane, rather than in a copy of the slab (75 MiB for a 300-slice organ map).

    Raises:
        ReportError: the label map is not on the report's grid, or no described segment
            has a voxel.
    """
    if len(sources) != label_map.shape[0]:
        raise ReportError(
            f"{len(sources)} source headers for a label map of {label_map.shape[0]} slices"
        )
    if not common.same_grid(report, label_map.affine, label_map.shape):
        raise ReportError(
            f"label map grid {label_map.shape} does not match the report geometry "
            f"{tuple(report.geometry.shape)}; write the SEG from the label maps of this report"
        )
    kept, numbered, first = _number_segments(label_map.array, segments, in_place=renumber_in_place)
    if not kept:
        raise ReportError("nothing to encode: no described segment has a voxel in the label map")
    slices = np.arange(first, first + numbered.shape[0])
    kind = "findings" if any(s.finding_id is not None for s in kept) else "organs"
    descriptions = [_description(report, i, s) for i, s in enumerate(kept, start=1)]
    texts = [d.SegmentLabel for d in descriptions] + [s.model for s in kept]
    texts += [s.model_version for s in kept] + [s.concept.meaning for s in kept]
    texts += [s.category.meaning for s in kept] + common.software_versions(report)
    models = [(s.model, s.model_version) for s in kept]
    character_set = output_character_set(sources[0], texts)
    positions = None
    if sources.frame_numbers:  # frames of one Enhanced instance: it is the one source image
        shielded, patient_name = common.shield_patient_name([sources[0]], character_set)
        frames.share_frame_geometry(shielded[0])
        positions = frames.plane_positions(shielded[0], [sources.frame_numbers[k] for k in slices])
    else:
        shielded, patient_name = common.shield_patient_name(
            [sources[k] for k in slices], character_set
        )
    try:
        seg = hd.seg.Segmentation(
            source_images=shielded,
            pixel_array=numbered,
            plane_positions=positions,
            segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
            segment_descriptions=descriptions,
            series_instance_uid=series_instance_uid or common.report_uid(report, "seg-series"),
            series_number=common.series_number(series_number, report),
            sop_instance_uid=common.report_uid(report, "seg", name or kind),
            instance_number=instance_number,
            manufacturer=common.MANUFACTURER,
            manufacturer_model_name=common.MANUFACTURER,
            software_versions=common.software_versions(report),
            device_serial_number=common.device_serial_number(),
            content_label=_CONTENT_LABEL[kind],
            content_description=common.lo(
                f"radserve {kind}: " + ", ".join(dict.fromkeys(f"{m} {v}" for m, v in models))
            ),
            series_description=common.series_description("radserve AI segmentation", report),
            contributing_equipment=common.contributing_equipment(report, models, "Segmentation"),
            specific_character_set=None,  # set below: see common.set_character_set
        )
    except (ValueError, TypeError, AttributeError) as exc:
        # highdicom names the rule that was broken; its messages carry no patient data.
        raise ReportError(f"DICOM SEG could not be built: {exc}") from exc
    _mark_lossy(seg, [sources[0]] if sources.frame_numbers else [sources[k] for k in slices])
    common.restore_patient_name(seg, patient_name, character_set)
    common.set_character_set(seg, character_set)
    logger.info(
        "SEG built: %d segments, %d frames from %d of %d slices",
        len(kept),
        int(seg.NumberOfFrames),
        len(slices),
        label_map.shape[0],
    )
    return seg


def _mark_lossy(seg: hd.seg.Segmentation, sources: Sequence[Dataset]) -> None:
    """Lossy Image Compression 01 when any source image was lossy compressed (PS3.3
    C.7.6.1.1.5: once 01, an image and what derives from it stay so). highdicom copies the
    attribute from the first source only: a JPEG Baseline study without it, or one whose
    first slice was not lossy, gave a SEG that said 00."""
    if str(seg.get("LossyImageCompression", "")) == "01":
        return
    for ds in sources:
        meta = getattr(ds, "file_meta", None)
        syntax = str(meta.get("TransferSyntaxUID", "")) if meta is not None else ""
        if lossy_compression(ds, syntax)[0]:
            seg.LossyImageCompression = "01"
            return


def write_seg(
    report: Report,
    label_map: Volume,
    segments: Sequence[Segment],
    source_files: Sequence[Path],
    out_path: Path,
    *,
    series_instance_uid: str | None = None,
    series_number: int = common.SEG_SERIES_NUMBER,
    instance_number: int = 1,
) -> Path:
    """Write ``label_map`` (on the report's grid) as a BINARY SEG at ``out_path``.

    ``source_files`` are the files of the source study (at least every slice's instance;
    other files are ignored). ``segments`` describe the label values to encode.
    """
    sources = common.slice_sources(report, common.read_headers(source_files))
    seg = build_seg(
        report,
        label_map,
        segments,
        sources,
        series_instance_uid=series_instance_uid,
        series_number=series_number,
        instance_number=instance_number,
    )
    return common.save_atomic(seg, out_path)


def _number_segments(
    labels: np.ndarray, segments: Sequence[Segment], *, in_place: bool = False
) -> tuple[list[Segment], np.ndarray, int]:
    """Keep described segments that have voxels; map their values to 1..n in value order.

    Returns the kept segments, the numbered slab from the first to the last slice holding
    one of them (contiguous, so the frames stay regularly spaced: Dimension Organization
    3D), and the slab's first slice. Only the slab is numbered, and where the label map
    already holds 1..n and nothing else the slab is a view of it: highdicom keeps the
    array it is given for the whole build, beside every frame packed twice, so a
    full-volume copy here was the SEG's largest cost (issue 19, goal 4). Where they need
    renumbering (a described value without voxels, an undescribed one), ``in_place``
    renumbers the slab inside ``labels`` when the numbers fit its type.
    """
    if len({s.value for s in segments}) != len(segments):
        raise ReportError("two segment descriptions share one label value")
    if labels.size and (labels.min() < 0 or not np.issubdtype(labels.dtype, np.integer)):
        raise ReportError(f"a label map must hold non-negative integers, got {labels.dtype}")
    size = int(labels.max(initial=0)) + 1
    ordered = sorted(segments, key=lambda s: s.value)
    values = [s.value for s in ordered if s.value < size]
    counts = np.zeros(size, dtype=np.int64)
    occupied = np.zeros((labels.shape[0], len(values)), dtype=bool)  # slice x described value
    for k, plane in enumerate(labels):  # slice by slice: bincount would copy the map as int64
        plane_counts = np.bincount(plane.ravel(), minlength=size)
        counts += plane_counts
        occupied[k] = plane_counts[values] > 0
    kept = [s for s in ordered if s.value < size and counts[s.value] > 0]
    for s in ordered:
        if s not in kept:
            logger.info("segment value %d has no voxels; left out of the SEG", s.value)
    described = {s.value for s in segments}
    undescribed = [v for v in np.flatnonzero(counts)[1:] if int(v) not in described]
    if undescribed:
        logger.warning("label values %s have no description; left out of the SEG", undescribed)
    lut = np.zeros(size, dtype=np.uint8 if len(kept) < 256 else np.uint16)
    for number, s in enumerate(kept, start=1):
        lut[s.value] = number
    if not kept:
        return kept, labels[:0], 0
    planes = np.flatnonzero(occupied.any(axis=1))  # described values with voxels are kept
    slab = labels[planes[0] : planes[-1] + 1]
    present = np.flatnonzero(counts)
    if slab.dtype in (np.uint8, np.uint16) and np.array_equal(lut[present], present):
        return kept, slab, int(planes[0])
    if in_place and slab.dtype == lut.dtype and slab.flags.writeable:
        for plane in slab:  # a plane's temporary, not the slab's
            plane[...] = lut[plane]
        return kept, slab, int(planes[0])
    return kept, lut[slab], int(planes[0])


def _description(report: Report, number: int, segment: Segment) -> hd.seg.SegmentDescription:
    finding = segment.finding_id is not None
    label = common.lesion_name(segment.finding_id) if finding else segment.label  # type: ignore[arg-type]
    regions = []
    if finding:
        organ = _containing_organ(report, segment.finding_id)  # type: ignore[arg-type]
        if organ is not None:
            regions.append(common.coded(organ))
    return hd.seg.SegmentDescription(
        segment_number=number,
        segment_label=common.lo(label),
        segmented_property_category=common.coded(segment.category),
        segmented_property_type=common.coded(segment.concept),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=hd.AlgorithmIdentificationSequence(
            name=common.lo(segment.model),
            family=codes.DCM.ArtificialIntelligence,
            version=common.lo(segment.model_version),
        ),
        tracking_uid=common.tracking_uid(report, segment_key(segment)),
        tracking_id=common.lo(label),
        anatomic_regions=regions or None,
        display_color=hd.color.CIELabColor.from_rgb(*segment.color),
    )


def _containing_organ(report: Report, finding_id: int) -> CodedConcept | None:
    finding = next((f for f in report.findings if f.finding_id == finding_id), None)
    if finding is None or finding.containing_organ is None:
        return None
    return common.organ_concepts(report).get(finding.containing_organ)
