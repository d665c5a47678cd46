"""Prediction -> Findings (lesions) and OrganMeasurements (organs).

Each connected component (26-connectivity) of a finding label (``kind: lesion`` or
``finding``) becomes one
:class:`~radserve.domain.Finding`, measured in the prediction's native geometry. The
manifest's rules decide which survive: the ``min_size`` ops, the label's ``within``
organs (looked up in the upstream organ model's label map), then the finding ops in
their order: ``min_confidence`` and ``nms`` (non-maximum suppression over the
findings' boxes, :func:`suppress`).

A finding whose component reaches an edge of the reported grid (first/last slice, row
or column; :mod:`radserve.postprocess.coverage`) is ``partial`` with those ``edges``:
its volume and diameters are lower bounds. The edge is the grid's (``ct``'s when the
prediction covers a box of it), not the box's.

Finding order and ids: findings are sorted by containing organ (the upstream organ
label value; findings outside any organ last), then volume (largest first), then
centroid; ids run 1..n in that order. The accompanying label map gives finding ``i``
the value ``i`` (``Finding.label_value == Finding.finding_id``), background 0; it is
uint8 up to 255 findings and uint16 beyond. SEG writers take segments from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from radserve.domain import Finding, OrganMeasurement, Prediction, Volume
from radserve.host import lazy_zeros
from radserve.models.manifest import LabelSpec, ModelSpec
from radserve.models.ops import MinConfidence, Nms
from radserve.postprocess.components import ComponentRun, component_runs
from radserve.postprocess.coverage import coverage_of, edges_touched
from radserve.postprocess.diameters import FindingAxes, axial_diameters
from radserve.postprocess.labelwise import box_voxels, map_labels
from radserve.preprocess.crop import BBox, bbox_of_values, grid_offset, label_bboxes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LesionFindings:
    """Everything the report stage needs about the lesions of one prediction.

    ``label_map`` has the prediction's geometry; voxel value ``i`` is finding ``i``.
    ``axes`` holds the RECIST measurement geometry of each finding, in finding order.
    ``warnings`` are short, patient-free notes for the report (e.g. a rule not applied).
    """

    findings: list[Finding]
    label_map: Volume
    axes: list[FindingAxes] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Candidate:
    finding: Finding  # numbered 0 until sorted
    organ_value: int | None
    component: int
    axes: FindingAxes
    box: tuple[slice, ...]  # on the reference grid
    confidence: float  # unclipped mean, as the rules compare it


def _finding_ops(
    candidates: list[_Candidate], ops: Sequence[MinConfidence | Nms], dropped: dict[str, int]
) -> list[_Candidate]:
    """Finding ops (``min_confidence``, ``nms``) on the candidates, in order."""
    for op in ops:
        if isinstance(op, MinConfidence):
            kept = [
                c
                for c in candidates
                if c.confidence >= op.value or (op.labels and c.finding.label not in op.labels)
            ]
            dropped["confidence"] += len(candidates) - len(kept)
        else:
            kept = suppress(candidates, op)
            dropped["nms"] += len(candidates) - len(kept)
        candidates = kept
    return candidates


def box_iou(a: tuple[slice, ...], b: tuple[slice, ...]) -> float:
    """Intersection over union of two voxel boxes (half-open slices)."""
    inter = 1
    for sa, sb in zip(a, b, strict=True):
        inter *= max(0, min(sa.stop, sb.stop) - max(sa.start, sb.start))
    if inter == 0:
        return 0.0
    size_a = int(np.prod([s.stop - s.start for s in a]))
    size_b = int(np.prod([s.stop - s.start for s in b]))
    return inter / (size_a + size_b - inter)


def suppress(candidates: list[_Candidate], op: Nms) -> list[_Candidate]:
    """Non-maximum suppression: most confident first (then larger), a candidate whose
    box overlaps a kept one's by more than ``op.iou`` is dropped. Candidates of labels
    ``op`` does not name pass untouched. Keeps the input order."""
    subject = [c for c in candidates if not op.labels or c.finding.label in op.labels]
    order = sorted(subject, key=lambda c: (-c.confidence, -c.finding.volume_ml, c.component))
    kept: list[_Candidate] = []
    for c in order:
        if not any(
            box_iou(c.box, k.box) > op.iou
            for k in kept
            if op.across_labels or k.finding.label == c.finding.label
        ):
            kept.append(c)
    gone = {id(c) for c in subject} - {id(c) for c in kept}
    return [c for c in candidates if id(c) not in gone]


def _sample(volume: Volume, indices: np.ndarray, grid: Volume) -> np.ndarray:
    """Values of ``volume`` at (N, 3) voxel indices of ``grid`` (nearest neighbour).

    Same geometry is a direct lookup; otherwise the points go through patient space,
    and points outside ``volume`` read 0.
    """
    if volume.same_geometry(grid):
        return volume.array[indices[:, 0], indices[:, 1], indices[:, 2]]
    target = np.rint(volume.patient_to_index(grid.index_to_patient(indices))).astype(np.int64)
    inside = np.all((target >= 0) & (target < np.asarray(volume.shape)), axis=1)
    out = np.zeros(len(indices), dtype=volume.array.dtype)
    t = target[inside]
    out[inside] = volume.array[t[:, 0], t[:, 1], t[:, 2]]
    return out


def _majority(values: np.ndarray) -> int | None:
    values = values[values > 0].astype(np.int64)
    if values.size == 0:
        return None
    return int(np.argmax(np.bincount(values)))


def _containing_organ(
    organs: Volume, mask: np.ndarray, box: tuple[slice, ...], grid: Volume
) -> int | None:
    """Majority non-zero organ label under the lesion.

    A lesion the organ model left out (a juxtapleural nodule is often a hole in the
    lung mask) overlaps no organ; then the one-voxel shell around it decides.
    """
    offset = np.array([s.start for s in box])
    organ = _majority(_sample(organs, np.argwhere(mask) + offset, grid))
    if organ is not None:
        return organ
    padded = np.pad(mask, 1)
    shell = ndimage.binary_dilation(padded, structure=np.ones((3, 3, 3), bool)) & ~padded
    idx = np.argwhere(shell) + offset - 1
    idx = idx[np.all((idx >= 0) & (idx < np.asarray(grid.shape)), axis=1)]
    return _majority(_sample(organs, idx, grid))


def _lesion_specs(spec: ModelSpec) -> dict[int, LabelSpec]:
    return {label.value: label for label in spec.finding_labels}


def find_lesions(
    prediction: Prediction,
    ct: Volume | None,
    spec: ModelSpec,
    organ_labels: Volume | None = None,
    organ_names: dict[int, str] | None = None,
    boxes: Sequence[BBox | None] | None = None,
) -> LesionFindings:
    """Turn the lesion labels of a prediction into measured, filtered, numbered findings.

    The prediction may cover only a box of ``ct``'s grid (a model restricted to an ROI
    returns its maps on that sub-grid): findings, axes and the label map are then given
    on ``ct``'s full grid all the same. Without ``ct`` (or when the prediction is not on
    a box of its grid) they are on the prediction's own grid.

    Args:
        prediction: label map (and optional uint8 confidence map), on the input grid or
            a box of it.
        ct: the input image, for mean HU (CT only; MR gives ``mean_hu=None``).
        spec: the manifest of the model that produced ``prediction``.
        organ_labels: upstream organ label map (any geometry in the same frame).
        organ_names: organ label value -> name, as used in ``LabelSpec.within``.
        boxes: the tight box of each value ``1..max`` of the prediction's label map
            (index ``v - 1``), when known (``CleanedLabels.boxes`` of
            :mod:`radserve.postprocess.components`): saves a pass over the map.
    """
    pred_grid = prediction.labels
    grid, origin = _reference_grid(pred_grid, ct)
    lesions = _lesion_specs(spec)
    warnings: list[str] = []
    if not lesions:
        return _empty(grid, warnings)
    labels = pred_grid.array
    values = sorted(lesions)
    box = bbox_of_values(labels, values, boxes)
    if box is None:
        return _empty(grid, warnings)
    runs = component_runs(labels[box], values)
    voxel_ml = grid.voxel_volume_ml
    min_ml = {value: spec.min_size_ml(label) for value, label in lesions.items()}
    # min_confidence ops before the first nms commute with everything before them: they
    # are checked per component, before its costly measurements.
    ops = spec.finding_ops
    n_early = next((i for i, op in enumerate(ops) if isinstance(op, Nms)), len(ops))
    early, late = ops[:n_early], ops[n_early:]
    organ_names = organ_names or {}
    if prediction.confidence is None:
        warnings.append(f"{spec.key}: no confidence map; finding confidence set to 1.0")
    if organ_labels is None and any(label.within for label in lesions.values()):
        warnings.append(f"{spec.key}: no organ label map; 'within' rules not applied")
    use_hu = ct is not None and spec.modality == "CT"

    candidates: list[_Candidate] = []
    dropped = {"size": 0, "confidence": 0, "within": 0, "nms": 0}
    for run, local, cbox in _components(runs):
        cid = run.first + local - 1
        volume_ml = float(run.counts[local]) * voxel_ml
        label = lesions[int(run.label[local])]
        if volume_ml < min_ml[label.value]:
            dropped["size"] += 1
            continue
        mask = run.components[cbox] == local
        # cbox: on the run's box; pbox: on the prediction's arrays; gbox: on the grid.
        offset = [b.start + r.start for b, r in zip(box, run.box, strict=True)]
        pbox = tuple(slice(s.start + o, s.stop + o) for s, o in zip(cbox, offset, strict=True))
        gbox = tuple(slice(s.start + o, s.stop + o) for s, o in zip(pbox, origin, strict=True))
        confidence = 1.0
        if prediction.confidence is not None:
            confidence = float(prediction.confidence.array[pbox][mask].mean()) / 255.0
        if any(confidence < op.value for op in early if not op.labels or label.name in op.labels):
            dropped["confidence"] += 1
            continue
        organ_value = None
        if organ_labels is not None:
            organ_value = _containing_organ(organ_labels, mask, gbox, grid)
        organ = None if organ_value is None else organ_names.get(organ_value, str(organ_value))
        if label.within and organ_labels is not None and organ not in label.within:
            dropped["within"] += 1
            continue
        voxels = np.argwhere(mask) + np.array([s.start for s in gbox])
        centroid_voxel = voxels.mean(axis=0)
        mean_hu = None
        if use_hu:
            assert ct is not None
            mean_hu = float(_sample(ct, voxels, grid).astype(np.float64).mean())
        axes = axial_diameters(mask, grid.affine, tuple(s.start for s in gbox))
        edges = edges_touched(gbox, grid.shape)
        candidates.append(
            _Candidate(
                finding=Finding(
                    finding_id=0,
                    label_value=0,
                    label=label.name,
                    concept=label.concept,
                    volume_ml=volume_ml,
                    longest_diameter_mm=axes.longest_diameter_mm,
                    short_axis_mm=axes.short_axis_mm,
                    centroid_mm=_t3(grid.index_to_patient(centroid_voxel)[0]),
                    centroid_voxel=_t3(centroid_voxel),
                    key_slice_index=axes.slice_index,
                    coverage="partial" if edges else "complete",
                    edges=edges,
                    containing_organ=organ,
                    mean_hu=mean_hu,
                    confidence=min(max(confidence, 0.0), 1.0),
                    model=prediction.model,
                    model_version=prediction.model_version,
                    precision=prediction.precision,
                ),
                organ_value=organ_value,
                component=cid,
                axes=axes,
                box=gbox,
                confidence=confidence,
            )
        )
    candidates = _finding_ops(candidates, late, dropped)
    logger.info(
        "%s: %d lesion components, %d findings, dropped %s",
        spec.key,
        sum(run.n for run in runs),
        len(candidates),
        dropped,
    )
    where = tuple(slice(s.start + o, s.stop + o) for s, o in zip(box, origin, strict=True))
    return _number(candidates, grid, runs, where, warnings)


def _reference_grid(pred_grid: Volume, ct: Volume | None) -> tuple[Volume, tuple[int, int, int]]:
    """The grid findings are reported on, and where the prediction's voxel 0 sits in it."""
    if ct is not None:
        origin = grid_offset(pred_grid, ct)
        if origin is not None:
            return ct, origin
    return pred_grid, (0, 0, 0)


def _empty(grid: Volume, warnings: list[str]) -> LesionFindings:
    return LesionFindings([], grid.with_array(lazy_zeros(grid.shape, np.uint8)), [], warnings)


def _components(
    runs: list[ComponentRun],
) -> Iterator[tuple[ComponentRun, int, tuple[slice, ...]]]:
    """Every component in id order: its run, local id and box on the run's box."""
    for run in runs:
        for local in range(1, run.n + 1):
            yield run, local, run.component_box(local)


def _number(
    candidates: list[_Candidate],
    grid: Volume,
    runs: list[ComponentRun],
    box: tuple[slice, ...],
    warnings: list[str],
) -> LesionFindings:
    """Sort, assign ids 1..n and paint the finding label map (``box``: where the runs'
    array lies on ``grid``). Only runs holding a finding are painted, so the map's
    untouched pages are never made resident."""

    def order(c: _Candidate) -> tuple[float, float, tuple[float, float, float]]:
        organ = float(c.organ_value) if c.organ_value is not None else float("inf")
        return (organ, -c.finding.volume_ml, c.finding.centroid_voxel)

    candidates.sort(key=order)
    dtype = np.uint8 if len(candidates) <= 255 else np.uint16
    lut = np.zeros(sum(run.n for run in runs) + 1, dtype=dtype)
    findings: list[Finding] = []
    axes: list[FindingAxes] = []
    for i, c in enumerate(candidates, start=1):
        lut[c.component] = i
        findings.append(c.finding.model_copy(update={"finding_id": i, "label_value": i}))
        axes.append(c.axes.model_copy(update={"finding_id": i}))
    out = lazy_zeros(grid.shape, dtype)
    for run in runs:
        local = run.local_lut(lut)
        if local.any():
            target = tuple(
                slice(b.start + r.start, b.start + r.stop)
                for b, r in zip(box, run.box, strict=True)
            )
            out[target] = local[run.components]
    return LesionFindings(findings, grid.with_array(out), axes, warnings)


def extract_findings(
    prediction: Prediction,
    ct: Volume | None,
    spec: ModelSpec,
    organ_labels: Volume | None = None,
    organ_names: dict[int, str] | None = None,
) -> list[Finding]:
    """The findings of :func:`find_lesions`, without the label map and axes."""
    return find_lesions(prediction, ct, spec, organ_labels, organ_names).findings


def organ_measurements(
    labels: Volume,
    ct: Volume | None,
    spec: ModelSpec,
    boxes: Sequence[BBox | None] | None = None,
    *,
    threads: int = 1,
) -> list[OrganMeasurement]:
    """Volume (ml) and mean HU of every region label (``kind: organ`` or ``structure``),
    in manifest order.

    Every organ label is listed, so "not found" is explicit and output-rate monitoring
    sees it: an absent one as ``not_found`` with no volume (not a measured 0 ml), one
    that reaches an edge of the volume as ``partial`` (its volume a lower bound; see
    :mod:`radserve.postprocess.coverage`). Mean HU needs CT in the
    same geometry. Each organ is counted inside its own box (``boxes``: of each value
    ``1..max`` of ``labels``, as :func:`radserve.postprocess.components.clean_label_map`
    returns them; found here when not given): organs fill a small part of a CT's box.
    ``threads``: the organs spread over this many threads (reads only; same answer).
    """
    organs = list(spec.region_labels)
    if not organs:
        return []
    top = max(label.value for label in organs)
    if boxes is None or len(boxes) < top:
        boxes = label_bboxes(labels.array, top)
    use_hu = ct is not None and spec.modality == "CT" and ct.same_geometry(labels)
    if ct is not None and spec.modality == "CT" and not use_hu:
        logger.warning("%s: CT and label map geometry differ; no mean HU", spec.key)
    voxel_ml = labels.voxel_volume_ml
    found = boxes

    def measure(label: LabelSpec) -> OrganMeasurement:
        box = found[label.value - 1]
        n, mean_hu = 0, None
        if box is not None:
            mask = labels.array[box] == label.value
            n = int(np.count_nonzero(mask))
            if use_hu and n:
                assert ct is not None
                total = np.sum(ct.array[box], where=mask, dtype=np.float64)
                mean_hu = float(total / n)
        coverage, edges = coverage_of(box if n else None, labels.shape)
        return OrganMeasurement(
            label=label.name,
            concept=label.concept,
            label_value=label.value,
            coverage=coverage,
            edges=edges,
            volume_ml=n * voxel_ml if n else None,
            mean_hu=mean_hu,
            model=spec.name,
            model_version=spec.version,
        )

    return map_labels(measure, organs, threads=threads, weight=box_voxels(found))


def _t3(p: np.ndarray) -> tuple[float, float, float]:
    return (float(p[0]), float(p[1]), float(p[2]))
