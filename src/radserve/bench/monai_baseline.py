"""The MONAI baseline: the same study and weights, processed the way a MONAI user would.

``LoadImage`` (MONAI's ``PydicomReader``) reads the DICOM folder; MONAI transforms crop,
resample and normalise it; ``SliceInferer`` (``sliding_window_inference`` one slice at a
time, the whole resampled slice as the window) runs the bundle's ONNX graph as a torch
module (:mod:`radserve.bench.torch_weights`: torch and MONAI are all it needs); the class
probabilities are resampled back onto the native grid and the winner taken. radserve's
own post-processing (``clean_labels``, ``find_lesions``) then runs on the result, so the
comparison isolates load + preprocess + inference.

Grid and order, so the answer is comparable voxel for voxel with radserve's:

* Array order. MONAI's reader stacks slices by Instance Number and returns
  (column, row, slice) with a RAS affine. We permute to radserve's (slice, row, column),
  convert the affine to LPS, and flip the slice axis when the series runs against the
  slice normal (radserve orders slices ascending along row x column direction). Gantry
  tilt (slice step not along the normal) is refused.
* Resampling grid. radserve (like nnU-Net and ``scipy.ndimage.zoom(grid_mode=True)``)
  keeps the field of view: ``m = round(n * s / t)`` voxels tile the same extent, so the
  actual spacing is ``n * s / m`` and new voxel ``j`` samples old index
  ``(j + 0.5) * n / m - 0.5``. ``Spacing(pixdim=t)`` does not: it keeps the first voxel
  centre and exactly ``t`` (``round((n - 1) * s / t) + 1`` voxels), up to half a voxel off
  at the far edge. ``Spacing(pixdim=n * s / m, scale_extent=True)`` gets the shape right,
  but MONAI 1.6's ``compute_shape_offset`` builds the origin from ``abs(...) * sign(...)``
  and misplaces the grid whenever the origin lies near 0 mm. So we call
  ``SpatialResample`` (what ``Spacing`` runs underneath) with the field-of-view-preserving
  destination affine and shape, bilinear, border padding: it then matches radserve's
  resampling to float32 rounding for any affine. The way back uses
  ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)`` with an
  explicit size, which samples exactly ``(j + 0.5) * n / m - 0.5`` with edges
  replicated: the same convention, per chunk of slices so no full-resolution
  probability volume is held.
* Field of view. Like radserve, a model without ``roi_labels`` runs on the body's box
  (radserve's ``body_bbox``, table removed), a model with them on the box of the organs
  output's ROI labels plus ``roi_margin_mm``; both are cut with ``SpatialCrop`` on the
  native grid before resampling, and the 2.5D context slices come from outside the box
  as in radserve (``radserve.preprocess.gather_context``, on the resampled HU before
  the intensity transforms, so ``context_mm`` models get the same z-interpolation).
  The crop matters for agreement, not only for speed: it moves the resampled lattice
  by a fraction of a voxel and the image against the U-Net's pooling grid, and U-Nets
  are not shift-invariant below their pooling stride. On the 60-slice bench phantom
  the whole slice (``crop_to_body=False``, also what the naive baseline does) gives a
  mean organ Dice of 0.984 against radserve; the same crop gives 1.0.

Intensity: ``ct_window`` is ``ScaleIntensityRange(clip=True)`` to [0, 1]; ``clip_zscore``
is ``ScaleIntensityRange`` as a clip followed by ``NormalizeIntensity(mean, std)``.
Padding to ``divisible_by`` is ``DivisiblePad`` (symmetric) with the normalised floor.

FP32 weights only: the FP16/INT8 variants are built and gated for onnxruntime, so a run
asked for another precision still converts ``model.onnx`` and says so in its result. 3D models and
``extra_channels`` are not supported here (the reference pipeline uses neither).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from radserve.bench.child import PIPELINE, TreeMemory, _rss_now_mb, _save, baseline_device
from radserve.bench.torch_weights import torch_model
from radserve.domain import Prediction, Volume
from radserve.errors import ModelError
from radserve.inference import choose_runtime
from radserve.models.manifest import ClipZScore, ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.postprocess.components import clean_labels
from radserve.postprocess.findings import find_lesions
from radserve.preprocess.context import context_reach, context_step, gather_context
from radserve.preprocess.crop import BBox, body_bbox, roi_bbox
from radserve.preprocess.normalise import normalised_floor

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["load_ct", "run_monai", "run_monai_pipeline"]

# Slices of probabilities mapped back to the native grid at once.
_BACK_CHUNK = 16
_RAS_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


# --- loading -------------------------------------------------------------------------------
def load_ct(folder: Path) -> Volume:
    """MONAI's ``LoadImage`` of a DICOM series, in radserve's (slice, row, column) order.

    The LPS affine's columns are the slice, row and column steps; slices ascend along
    the normal (row direction x column direction), as radserve's ingest orders them.
    """
    from monai.data import PydicomReader
    from monai.transforms import LoadImage

    image = LoadImage(reader=PydicomReader(), image_only=True, ensure_channel_first=True)(
        str(folder)
    )
    if image.ndim != 4 or image.shape[0] != 1:
        raise ModelError(f"expected one single-channel 3-D series in {folder}, got {image.shape}")
    ras = np.asarray(image.affine, dtype=np.float64)  # columns: column, row, slice steps
    affine = _RAS_LPS @ ras[:, [2, 1, 0, 3]]
    array = image[0].permute(2, 1, 0).numpy().astype(np.float32, copy=False)
    cols, rows = affine[:3, 2], affine[:3, 1]
    normal = np.cross(cols / np.linalg.norm(cols), rows / np.linalg.norm(rows))
    step = affine[:3, 0]
    cos = float(np.dot(step, normal) / max(np.linalg.norm(step), 1e-12))
    if abs(cos) < 0.999:
        raise ModelError(
            f"slice step {step} is not along the slice normal {normal} (gantry tilt or an "
            "Instance Number order that does not follow position); not supported here"
        )
    if cos < 0:  # head-first numbering: flip to ascending along the normal
        array = array[::-1]
        affine[:3, 3] = affine[:3, 3] + step * (array.shape[0] - 1)
        affine[:3, 0] = -step
    return Volume(np.ascontiguousarray(array), affine)


# --- one model -----------------------------------------------------------------------------
def _fov_affine(affine: np.ndarray, shape: tuple[int, ...], out: tuple[int, ...]) -> np.ndarray:
    """Affine of the field-of-view-preserving grid of ``out`` voxels over ``shape``."""
    scale = np.array([n / m for n, m in zip(shape, out, strict=True)])
    index = np.eye(4)
    index[:3, :3] = np.diag(scale)
    index[:3, 3] = 0.5 * scale - 0.5
    return affine @ index


def _intensity(spec: ModelSpec) -> Any:
    """The model's normalisation as MONAI intensity transforms."""
    from monai.transforms import Compose, NormalizeIntensity, ScaleIntensityRange

    norm = spec.input.normalisation
    if isinstance(norm, ClipZScore):
        return Compose(
            [
                ScaleIntensityRange(norm.lower, norm.upper, norm.lower, norm.upper, clip=True),
                NormalizeIntensity(subtrahend=norm.mean, divisor=norm.std),
            ]
        )
    lower = norm.center - norm.width / 2.0
    return ScaleIntensityRange(lower, lower + norm.width, 0.0, 1.0, clip=True)


def predict(
    ct: Volume,
    spec: ModelSpec,
    model: torch.nn.Module,
    box: BBox | None = None,
    stages: dict[str, float] | None = None,
    device: str = "cpu",
) -> Prediction:
    """One 2D/2.5D model over ``box`` (default: the whole volume), labels on the native grid;
    the windows and their logits on ``device`` (the model's)."""
    import torch
    from monai.data import MetaTensor
    from monai.inferers import SliceInferer
    from monai.transforms import DivisiblePad, SpatialCrop, SpatialResample

    stages = {} if stages is None else stages
    if spec.input.mode not in ("2d", "2.5d") or spec.input.extra_channels:
        raise ModelError(f"MONAI baseline: 2d/2.5d models without extra channels only: {spec.key}")
    t0 = time.perf_counter()
    nz = ct.shape[0]
    zs, ys, xs = box or tuple(slice(0, n) for n in ct.shape)
    labels = np.zeros(ct.shape, np.uint8)
    confidence = np.full(ct.shape, 255, np.uint8)
    k = spec.input.context_slices
    step = context_step(spec.input.context_mm, ct.spacing[0])
    if zs.stop <= zs.start or ys.stop <= ys.start or xs.stop <= xs.start:
        return _prediction(ct, spec, labels, confidence)
    # Crop (with the 2.5D context slices around the box), resample in-plane, normalise.
    reach = context_reach(k, step)
    z_lo, z_hi = max(0, zs.start - reach), min(nz, zs.stop + reach)
    image = MetaTensor(torch.from_numpy(ct.array)[None], affine=torch.from_numpy(ct.affine))
    image = SpatialCrop(roi_slices=(slice(z_lo, z_hi), ys, xs))(image)
    crop = tuple(int(n) for n in image.shape[1:])
    target = spec.input.spacing
    native = ct.spacing
    size = (crop[0], *(max(1, round(crop[a] * native[a] / target[a])) for a in (1, 2)))
    dst = _fov_affine(np.asarray(image.affine, np.float64), crop, size)
    image = SpatialResample(mode="bilinear", padding_mode="border", dtype=np.float32)(
        image, dst_affine=torch.from_numpy(dst), spatial_size=size
    )
    # 2.5D: neighbours as channels, clamped at the volume's ends (the crop holds all it
    # reaches), by radserve's own rule (``context_mm``: interpolated in z, on HU).
    z = np.arange(zs.start, zs.stop) - z_lo
    hu = image.as_tensor()[0].numpy()
    stacked = torch.from_numpy(gather_context(hu, z, k, step).transpose(1, 0, 2, 3))
    stacked = _intensity(spec)(stacked)  # (2k+1, slices, rh, rw)
    div = spec.input.divisible_by
    floor = normalised_floor(spec.input.normalisation)
    padded = DivisiblePad((1, div, div), method="symmetric", value=floor)(stacked)
    rh, rw = size[1], size[2]
    ph, pw = padded.shape[2], padded.shape[3]
    top, left = (ph - rh) // 2, (pw - rw) // 2
    t1 = time.perf_counter()
    stages[f"{spec.name}: preprocess"] = stages.get(f"{spec.name}: preprocess", 0.0) + t1 - t0
    # Inference: one window per slice, ``batch_size`` slices per forward pass.
    inferer = SliceInferer(
        roi_size=(ph, pw),
        sw_batch_size=spec.input.batch_size,
        spatial_dim=0,
        cval=floor,
        sw_device=device,
        device=device,
    )
    with torch.no_grad():
        logits = inferer(torch.as_tensor(padded)[None], model)[0]  # (classes, slices, ph, pw)
    t2 = time.perf_counter()
    stages[f"{spec.name}: inference"] = stages.get(f"{spec.name}: inference", 0.0) + t2 - t1
    logits = logits[:, :, top : top + rh, left : left + rw]
    h, w = ys.stop - ys.start, xs.stop - xs.start
    for start in range(0, logits.shape[1], _BACK_CHUNK):
        part = logits[:, start : start + _BACK_CHUNK].permute(1, 0, 2, 3).float()
        probs = torch.softmax(part, 1) if spec.activation == "softmax" else torch.sigmoid(part)
        if (rh, rw) != (h, w):
            probs = torch.nn.functional.interpolate(
                probs, size=(h, w), mode="bilinear", align_corners=False
            )
        best, winner = probs.max(dim=1)
        if spec.activation == "sigmoid":
            keep = best >= spec.threshold
            winner = torch.where(keep, winner + 1, 0)
            best = torch.where(keep, best, 1.0 - best)
        rows = slice(zs.start + start, zs.start + start + probs.shape[0])
        labels[rows, ys, xs] = winner.cpu().numpy().astype(np.uint8)
        confidence[rows, ys, xs] = (best.clamp(0, 1) * 255 + 0.5).cpu().numpy().astype(np.uint8)
    stages[f"{spec.name}: back to native"] = time.perf_counter() - t2
    return _prediction(ct, spec, labels, confidence)


def _prediction(ct: Volume, spec: ModelSpec, labels: np.ndarray, conf: np.ndarray) -> Prediction:
    return Prediction(
        model=spec.name,
        model_version=spec.version,
        precision="fp32",
        labels=ct.with_array(labels),
        confidence=ct.with_array(conf),
    )


# --- the pipeline --------------------------------------------------------------------------
def run_monai_pipeline(
    folder: Path,
    pipeline: PipelineSpec,
    registry: ModelRegistry,
    models: dict[str, torch.nn.Module],
    *,
    crop_to_body: bool = True,
    device: str = "cpu",
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Organ labels, findings mask and stage seconds; ``models`` are built (and warmed)
    by the caller, keyed by model name. ``crop_to_body=False`` runs models without an ROI
    on the whole slice (see the module docstring for what that costs in agreement)."""
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    ct = load_ct(folder)
    stages["load"] = time.perf_counter() - t0
    organs: Prediction | None = None
    organ_spec: ModelSpec | None = None
    findings = np.zeros(ct.shape, np.uint8)
    for step in pipeline.steps:
        spec = registry.get(step.model, step.version).spec
        box: BBox | None = None
        if spec.input.roi_labels:
            if organs is None or organ_spec is None:
                raise ModelError(f"model {spec.key} needs an organ step before it")
            values = [lb.value for lb in organ_spec.labels if lb.name in spec.input.roi_labels]
            empty = (slice(0, 0), slice(0, 0), slice(0, 0))
            box = roi_bbox(organs.labels, values, spec.input.roi_margin_mm) or empty
        elif crop_to_body and spec.modality == "CT":
            box = body_bbox(ct)
        pred = predict(ct, spec, models[spec.name], box, stages, device)
        t1 = time.perf_counter()
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
            names = {lb.value: lb.name for lb in organ_spec.labels} if organ_spec else None
            lesions = find_lesions(pred, ct, spec, organs.labels if organs else None, names)
            findings = (lesions.label_map.array > 0).astype(np.uint8)
        else:
            organs, organ_spec = pred, spec
        stages[f"{spec.name}: postprocess"] = time.perf_counter() - t1
    stages["total"] = time.perf_counter() - t0
    organ_map = organs.labels.array if organs else np.zeros(ct.shape, np.uint8)
    return organ_map, findings, stages


def run_monai(
    study: Path,
    workdir: Path,
    precision: str,
    *,
    pipeline: PipelineSpec | None = None,
    registry: ModelRegistry | None = None,
    crop_to_body: bool = True,
) -> dict[str, object]:
    """The benchmark child's MONAI contestant (see :mod:`radserve.bench.child`).

    Writes ``labels.npz`` into ``workdir``; ``pipeline`` and ``registry`` default to the
    reference pipeline and the bundled models (tests pass tiny ones).
    """
    import torch

    registry = registry or ModelRegistry()
    pipeline = pipeline or load_pipeline(PIPELINE)
    if precision != "fp32":
        logger.warning("MONAI baseline runs the FP32 weights (asked for %s)", precision)
    threads = choose_runtime().intra_op_threads
    torch.set_num_threads(threads)
    device = baseline_device()
    models: dict[str, torch.nn.Module] = {}
    for step in pipeline.steps:
        bundle = registry.get(step.model, step.version)
        model = torch_model(bundle).to(device)
        with torch.no_grad():  # warm up, as the servers are before studies arrive
            model(torch.zeros((1, bundle.spec.input.in_channels, 256, 256), device=device))
        models[bundle.spec.name] = model
    rss_warm = _rss_now_mb()
    with TreeMemory() as memory:
        t0 = time.perf_counter()
        organs, findings, stages = run_monai_pipeline(
            study, pipeline, registry, models, crop_to_body=crop_to_body, device=device
        )
        elapsed = time.perf_counter() - t0
    workdir.mkdir(parents=True, exist_ok=True)
    _save(workdir, organs, findings)
    return {
        "seconds": elapsed,
        "stages": stages,
        **memory.report(rss_warm),
        "threads": threads,
        "device": device,
        "precision": "fp32",
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("monai", "torch")}
