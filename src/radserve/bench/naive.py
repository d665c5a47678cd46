"""The baseline radserve is measured against: how a study is often processed today.

pydicom reads every file in turn into a list and stacks it; every slice goes through
the model alone (batch 1), resampled with ``scipy.ndimage.zoom``; nothing overlaps. The
model runs in PyTorch eager mode when torch is installed (the weights converted from the
bundle's ONNX file), else in ONNX Runtime at batch 1 (``naive-ort``). Same weights, same
crops and pre/post-processing semantics (grid, normalisation, softmax, argmax, component
rules), so its answer must match radserve's: the benchmark checks that agreement (Dice)
before it reports any speed-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pydicom
from scipy import ndimage

from radserve.domain import Prediction, Volume
from radserve.inference.slices import crop_box
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import PipelineSpec
from radserve.postprocess.components import clean_labels
from radserve.postprocess.findings import find_lesions
from radserve.preprocess import context_step, gather_context, normalise
from radserve.preprocess.crop import BBox, roi_bbox
from radserve.preprocess.normalise import normalised_floor

_EMPTY: BBox = (slice(0, 0), slice(0, 0), slice(0, 0))


Runner = Callable[[np.ndarray], np.ndarray]
"""(N, C, H, W) float32 input -> logits: an ONNX Runtime session or a torch module."""


@dataclass
class NaiveResult:
    organs: np.ndarray
    findings: np.ndarray
    stages: dict[str, float] = field(default_factory=dict)


def load_serial(folder: Path) -> Volume:
    """One file after another; sorted along the slice normal (the one thing done right)."""
    slices = []
    for path in sorted(Path(folder).rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        hu = ds.pixel_array.astype(np.float32) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        slices.append((ds, hu))
    first = slices[0][0]
    iop = np.array(first.ImageOrientationPatient, float)
    normal = np.cross(iop[:3], iop[3:])
    slices.sort(key=lambda s: float(np.dot(normal, np.array(s[0].ImagePositionPatient, float))))
    array = np.stack([hu for _, hu in slices])
    ipp0 = np.array(slices[0][0].ImagePositionPatient, float)
    ipp1 = np.array(slices[-1][0].ImagePositionPatient, float)
    dz = float(np.linalg.norm(ipp1 - ipp0)) / max(len(slices) - 1, 1)
    row_spacing, col_spacing = (float(v) for v in first.PixelSpacing)
    affine = np.eye(4)
    affine[:3, 0] = normal * dz
    affine[:3, 1] = iop[3:] * row_spacing
    affine[:3, 2] = iop[:3] * col_spacing
    affine[:3, 3] = ipp0
    return Volume(array, affine, str(first.FrameOfReferenceUID))


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=0, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=0, keepdims=True)


def predict_per_slice(
    ct: Volume, spec: ModelSpec, run: Runner, precision: str, roi: BBox | None = None
) -> Prediction:
    """Batch-1 inference, one slice after another, on the same crop radserve uses
    (body, or the upstream ROI): the crop moves the U-Net's pooling grid, and the
    baseline must give the same answer for the comparison to mean anything."""
    zs, ys, xs = crop_box(ct, spec, roi, crop_to_body=True)
    h, w = ys.stop - ys.start, xs.stop - xs.start
    k = spec.input.context_slices
    zoom = (ct.spacing[1] / spec.input.spacing[1], ct.spacing[2] / spec.input.spacing[2])
    div = spec.input.divisible_by
    floor = normalised_floor(spec.input.normalisation)
    labels = np.zeros(ct.shape, np.uint8)
    confidence = np.zeros(ct.shape, np.uint8)
    step = context_step(spec.input.context_mm, ct.spacing[0])
    for z in range(zs.start, zs.stop):
        channels = []
        # The 2.5D neighbours by radserve's rule (native ±1..k, or every context_mm in z).
        for hu in gather_context(ct.array, [z], k, step, (ys, xs))[0]:
            small = ndimage.zoom(hu, zoom, order=1, mode="nearest", grid_mode=True)
            channels.append(normalise(small, spec.input.normalisation))
        image = np.stack(channels)
        rh, rw = image.shape[1:]
        ph, pw = -(-rh // div) * div, -(-rw // div) * div
        top, left = (ph - rh) // 2, (pw - rw) // 2
        padded = np.full((1, image.shape[0], ph, pw), floor, np.float32)
        padded[0, :, top : top + rh, left : left + rw] = image
        logits = run(padded)[0, :, top : top + rh, left : left + rw]
        probs = _softmax(logits)
        back = np.stack(
            [
                ndimage.zoom(p, (h / rh, w / rw), order=1, mode="nearest", grid_mode=True)
                for p in probs
            ]
        )
        labels[z, ys, xs] = np.argmax(back, axis=0)
        confidence[z, ys, xs] = np.round(np.max(back, axis=0) * 255).astype(np.uint8)
    return Prediction(
        model=spec.name,
        model_version=spec.version,
        precision=precision,
        labels=ct.with_array(labels),
        confidence=ct.with_array(confidence),
    )


def run_naive(
    folder: Path,
    pipeline: PipelineSpec,
    registry: ModelRegistry,
    runners: dict[str, Runner],
    precision: str = "fp32",
) -> NaiveResult:
    """The whole baseline; ``runners`` (model name -> batch function) are created and
    warmed by the caller."""
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    ct = load_serial(folder)
    stages["load"] = time.perf_counter() - t0
    organs: Prediction | None = None
    finding_map = np.zeros(ct.shape, np.uint8)
    for step in pipeline.steps:
        spec = registry.get(step.model, step.version).spec
        t1 = time.perf_counter()
        roi = None
        if spec.input.roi_labels and organs is not None:
            names = {lb.name: lb.value for lb in registry.get(organs.model).spec.labels}
            values = [names[n] for n in spec.input.roi_labels]
            roi = roi_bbox(organs.labels, values, spec.input.roi_margin_mm) or _EMPTY
        pred = predict_per_slice(ct, spec, runners[spec.name], precision, roi)
        stages[f"{spec.name}: inference"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        cleaned = pred.labels.with_array(
            clean_labels(pred.labels.array, spec, ct.voxel_volume_ml, spacing=ct.spacing)
        )
        pred = Prediction(
            model=pred.model,
            model_version=pred.model_version,
            precision=pred.precision,
            labels=cleaned,
            confidence=pred.confidence,
        )
        if spec.finding_labels:
            names = (
                {lb.value: lb.name for lb in registry.get(organs.model).spec.labels}
                if organs
                else None
            )
            lesions = find_lesions(pred, ct, spec, organs.labels if organs else None, names)
            finding_map = (lesions.label_map.array > 0).astype(np.uint8)
        else:
            organs = pred
        stages[f"{spec.name}: postprocess"] = time.perf_counter() - t2
    stages["total"] = time.perf_counter() - t0
    return NaiveResult(
        organs=organs.labels.array if organs else np.zeros(ct.shape, np.uint8),
        findings=finding_map,
        stages=stages,
    )
