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
    labels = clean_labels(pred.labels.array, spec, pred.labels.voxel_volume_ml)
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
    from radserve.evaluation.lesions import GtLesion, match_lesions
    from radserve.postprocess.findings import find_lesions

    loose = spec.model_copy(
        update={"postprocess": spec.postprocess.model_copy(update={"min_confidence": 0.0})}
    )
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
