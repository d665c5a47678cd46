"""Whole-volume validation of an exported model through radserve's own inference path.

The ONNX file runs through :class:`radserve.inference.slices.SliceTask` (crop, resample,
normalise, pad, back-map) on held-out validation phantoms, then through the same
post-processing the server applies (``clean_labels`` for organs, ``find_lesions`` for
lesions), and lesions are scored with the evaluation package's one-to-one matching.
This is what picks the lesion model's ``min_confidence``. No torch here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from radserve.domain.volume import Volume
from radserve.evaluation.lesions import GtLesion, LesionOutcome, size_stratum
from radserve.models.manifest import ModelSpec
from radserve.training.data import PhantomArrays, roi_box
from radserve.training.recipes import ORGAN_LABELS

logger = logging.getLogger(__name__)

ORGAN_NAMES = {i + 1: name for i, (name, *_rest) in enumerate(ORGAN_LABELS)}


def run_slices(path: Path, spec: ModelSpec, volume: Volume, roi=None, threads: int = 1):
    """Native-grid :class:`Prediction` of ``volume`` by the ONNX model at ``path``."""
    from radserve.inference.slices import SliceTask

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    task = SliceTask(volume, spec, roi=roi)
    while (batch := task.next_batch()) is not None:
        task.accept(batch, session.run(None, {name: batch.inputs})[0])
    return task.finish()


def organ_dice(path: Path, spec: ModelSpec, phantom: PhantomArrays, threads: int = 1):
    """Per-organ Dice on the native grid after the manifest's component clean-up."""
    from radserve.evaluation.metrics import dice
    from radserve.postprocess.components import clean_labels

    pred = run_slices(path, spec, phantom.ct, threads=threads)
    labels = clean_labels(
        pred.labels.array, spec, pred.labels.voxel_volume_ml, spacing=pred.labels.spacing
    )
    return {
        label.name: dice(labels == label.value, phantom.organs == label.value)
        for label in spec.labels
    }


@dataclass
class LesionSweep:
    """Detection outcome per ``min_confidence`` candidate, summed over studies."""

    thresholds: list[float]
    detected: dict[str, np.ndarray] = field(default_factory=dict)  # stratum -> per t
    totals: dict[str, int] = field(default_factory=dict)
    false_positives: np.ndarray | None = None
    studies: int = 0

    def add(self, outcomes_per_t: list, fps_per_t: list[int]) -> None:
        self.studies += 1
        fps = np.asarray(fps_per_t)
        self.false_positives = fps if self.false_positives is None else self.false_positives + fps
        for ti, outcomes in enumerate(outcomes_per_t):
            for o in outcomes:
                key = _stratum_group(o.diameter_mm)
                self.detected.setdefault(key, np.zeros(len(self.thresholds), int))
                self.detected[key][ti] += int(o.detected)
                if ti == 0:
                    self.totals[key] = self.totals.get(key, 0) + 1

    def row(self, ti: int) -> dict:
        recall = {
            k: round(float(self.detected[k][ti]) / self.totals[k], 4) for k in sorted(self.totals)
        }
        assert self.false_positives is not None
        return {
            "min_confidence": self.thresholds[ti],
            "recall": recall,
            "lesions": dict(sorted(self.totals.items())),
            "fp_per_study": round(float(self.false_positives[ti]) / max(1, self.studies), 3),
        }


def _stratum_group(diameter_mm: float) -> str:
    if diameter_mm < 5:
        return "<5mm"
    return "5-10mm" if diameter_mm < 10 else ">=10mm"


def lesion_sweep(
    path: Path,
    spec: ModelSpec,
    phantoms: list[PhantomArrays],
    thresholds: list[float],
    threads: int = 1,
) -> LesionSweep:
    """Run the lesion model on each phantom (ROI from its true organs) and score every
    ``min_confidence`` in ``thresholds`` with the evaluation package's matching."""
    from radserve.evaluation.lesions import match_lesions
    from radserve.postprocess.findings import find_lesions

    loose = spec.with_finding_rules(min_confidence=0.0)
    sweep = LesionSweep(thresholds=thresholds)
    for phantom in phantoms:
        ct = phantom.ct
        roi = roi_box(phantom.organs, spec, ct.spacing)
        pred = run_slices(path, loose, ct, roi=roi, threads=threads)
        organs = ct.with_array(phantom.organs)
        result = find_lesions(pred, ct, loose, organs, ORGAN_NAMES)
        gt = [
            GtLesion(
                lesion_id=int(r["id"]),
                centre_mm=tuple(r["centre_mm"]),
                diameter_mm=float(r["diameter_mm"]),
                kind=str(r["kind"]),
            )
            for r in phantom.lesions
        ]
        outcomes, fps = [], []
        label_map = result.label_map.array
        for t in thresholds:
            keep = np.zeros(len(result.findings) + 1, label_map.dtype)
            for f in result.findings:
                if f.confidence >= t:
                    keep[f.label_value] = f.label_value
            pred_instances = keep[label_map]
            study = match_lesions(phantom.lesion_instances, gt, pred_instances, ct)
            outcomes.append(study.outcomes)
            fps.append(study.n_false_positive)
        sweep.add(outcomes, fps)
        logger.info(
            "lesion validation: %d GT lesions, %d findings (min_confidence 0)",
            len(gt),
            len(result.findings),
        )
    return sweep


def choose_min_confidence(sweep: LesionSweep, max_fp_per_study: float = 0.5) -> tuple[int, dict]:
    """Lowest threshold whose FP rate is within budget (it keeps the most recall)."""
    assert sweep.false_positives is not None
    fp = sweep.false_positives / max(1, sweep.studies)
    ok = np.flatnonzero(fp <= max_fp_per_study)
    ti = int(ok[0]) if ok.size else len(sweep.thresholds) - 1
    return ti, sweep.row(ti)


@dataclass
class PipelineSweep:
    """Detection outcome per (min_component_ml, min_confidence), through the pipeline."""

    min_mls: list[float]
    sweeps: list[LesionSweep]
    seconds_per_study: float = 0.0

    def rows(self) -> list[dict]:
        return [
            {"min_component_ml": ml, **sweep.row(ti)}
            for ml, sweep in zip(self.min_mls, self.sweeps, strict=True)
            for ti in range(len(sweep.thresholds))
        ]


def pipeline_lesion_sweep(
    spec: ModelSpec,
    onnx_path: Path,
    organ_roots: list[Path],
    organs_version: str,
    seeds: list[int],
    thresholds: list[float],
    min_mls: list[float],
    *,
    small: bool = False,
    threads: int = 1,
) -> PipelineSweep:
    """Run ``organs`` then this lesion model through :func:`radserve.pipeline.run_volume`
    on each validation phantom, exactly as ``radserve evaluate`` does (ROI and
    ``within`` from the organs model's prediction), and score every
    (``min_component_ml``, ``min_confidence``) pair with the evaluation's matching.

    The lesion bundle runs with both rules at 0 (a loose copy in a temporary folder);
    findings are then filtered by their volume and confidence, which is what the rules
    do inside ``clean_labels`` and ``find_lesions``.
    """
    import shutil
    import tempfile
    import time

    from radserve.evaluation.runner import phantom_truth
    from radserve.inference import choose_runtime
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline import SessionPool, run_volume
    from radserve.pipeline.spec import PipelineSpec, Step
    from radserve.training.bundle import write_manifest

    loose = spec.with_finding_rules(min_confidence=0.0, min_size_ml=0.0)
    sweeps = [LesionSweep(thresholds=list(thresholds)) for _ in min_mls]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="radserve-tune-") as tmp:
        folder = Path(tmp) / spec.name / spec.version
        folder.mkdir(parents=True)
        shutil.copyfile(onnx_path, folder / spec.files["fp32"])
        write_manifest(loose, folder)
        registry = ModelRegistry([Path(tmp), *organ_roots])
        pipeline = PipelineSpec(
            name="lesion-tuning",
            version="1.0.0",
            steps=(
                Step(model="organs", version=organs_version),
                Step(model=spec.name, version=spec.version),
            ),
        )
        sessions = SessionPool(choose_runtime(prefer=["CPUExecutionProvider"], threads=threads))
        for seed in seeds:
            truth = phantom_truth(seed, small=small)
            result = run_volume(truth.ct, pipeline, registry=registry, sessions=sessions)
            step = result.lesion_step
            findings = step.findings if step else []
            label_map = (
                step.finding_labels.array
                if step is not None and step.finding_labels is not None
                else np.zeros(truth.ct.shape, np.uint8)
            )
            gt_crop, pred_crop, grid = _lesion_crop(truth.lesions, label_map, truth.ct)
            table = MatchTable.build(gt_crop, list(truth.lesion_list), pred_crop, grid)
            for ml, sweep in zip(min_mls, sweeps, strict=True):
                outcomes, fps = [], []
                for t in thresholds:
                    kept = {
                        f.label_value for f in findings if f.confidence >= t and f.volume_ml >= ml
                    }
                    study_outcomes, n_fp = table.match(kept)
                    outcomes.append(study_outcomes)
                    fps.append(n_fp)
                sweep.add(outcomes, fps)
            logger.info(
                "tuning seed %d: %d GT lesions, %d findings at 0/0",
                seed,
                len(truth.lesion_list),
                len(findings),
            )
    seconds = (time.perf_counter() - t0) / max(1, len(seeds))
    return PipelineSweep(min_mls=list(min_mls), sweeps=sweeps, seconds_per_study=seconds)


@dataclass
class MatchTable:
    """Every (GT lesion, predicted component) candidate pair of one study, computed once,
    so that the one-to-one matching of :func:`radserve.evaluation.lesions.match_lesions`
    can be replayed for any subset of components (one per rule pair) in microseconds.

    Candidates and their order are exactly ``match_lesions``'s: shared voxels, or the
    component's centroid within the GT radius; largest overlap first, then nearest.
    """

    lesions: list[GtLesion]
    component_ids: list[int]
    pairs: list[tuple[int, float, int, int]]  # (overlap, -distance, gt index, component)

    @classmethod
    def build(
        cls, gt: np.ndarray, gt_lesions: list[GtLesion], pred: np.ndarray, grid: Volume
    ) -> MatchTable:
        from radserve.evaluation.lesions import component_centroids, instance_overlaps

        ids, centroids_vox = component_centroids(pred)
        overlap = instance_overlaps(gt, pred)
        centroids = grid.index_to_patient(centroids_vox) if ids else np.zeros((0, 3))
        pairs = []
        for gi, lesion in enumerate(gt_lesions):
            dist = np.linalg.norm(centroids - np.asarray(lesion.centre_mm, float), axis=1)
            for pi, pid in enumerate(ids):
                voxels = overlap.get((lesion.lesion_id, pid), 0)
                if voxels > 0 or float(dist[pi]) <= lesion.diameter_mm / 2.0:
                    pairs.append((voxels, -float(dist[pi]), gi, pid))
        pairs.sort(reverse=True)
        return cls(list(gt_lesions), ids, pairs)

    def match(self, kept: set[int]) -> tuple[list[LesionOutcome], int]:
        """(outcomes, false positives) when only components ``kept`` are predicted."""
        matched: dict[int, int] = {}
        used: set[int] = set()
        for _v, _d, gi, pid in self.pairs:
            if pid in kept and gi not in matched and pid not in used:
                matched[gi] = pid
                used.add(pid)
        outcomes = [
            LesionOutcome(
                lesion_id=lesion.lesion_id,
                diameter_mm=lesion.diameter_mm,
                kind=lesion.kind,
                stratum=size_stratum(lesion.diameter_mm),
                matched_component=matched.get(gi),
            )
            for gi, lesion in enumerate(self.lesions)
        ]
        false_positives = sum(1 for pid in self.component_ids if pid in kept and pid not in used)
        return outcomes, false_positives


def _lesion_crop(
    gt: np.ndarray, pred: np.ndarray, ct: Volume
) -> tuple[np.ndarray, np.ndarray, Volume]:
    """Both instance maps cut to the box holding every lesion and finding, on a grid
    shifted to match: matching there gives the same answer dozens of times faster than
    on the whole study (it runs once per rule pair)."""
    from radserve.preprocess import bbox_of_mask

    box = bbox_of_mask((gt > 0) | (pred > 0)) or (slice(0, 1), slice(0, 1), slice(0, 1))
    start = np.array([s.start for s in box], float)
    affine = ct.affine.copy()
    affine[:3, 3] = affine[:3, 3] + affine[:3, :3] @ start
    gt_crop = np.ascontiguousarray(gt[box])
    return gt_crop, np.ascontiguousarray(pred[box]), Volume(gt_crop, affine)


def choose_rules(sweep: PipelineSweep, max_fp_per_study: float) -> dict:
    """The (min_component_ml, min_confidence) row within the FP budget with the best
    5-10 mm recall, then >= 10 mm recall, then fewest false positives."""
    best: tuple | None = None
    for ml, s in zip(sweep.min_mls, sweep.sweeps, strict=True):
        assert s.false_positives is not None
        for ti in range(len(s.thresholds)):
            row = {"min_component_ml": ml, **s.row(ti)}
            if row["fp_per_study"] > max_fp_per_study:
                continue
            key = (
                row["recall"].get("5-10mm", 0.0),
                row["recall"].get(">=10mm", 0.0),
                -row["fp_per_study"],
                -row["min_confidence"],
            )
            if best is None or key > best[0]:
                best = (key, row)
    if best is None:  # nothing within budget: the strictest rules
        s = sweep.sweeps[-1]
        return {"min_component_ml": sweep.min_mls[-1], **s.row(len(s.thresholds) - 1)}
    return best[1]
