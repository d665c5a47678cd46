"""3D models: Gaussian-weighted sliding window over the volume at the model's spacing.

The crop (ROI, or body for CT) is resampled to ``spec.input.spacing`` (a ``None`` slice
spacing keeps native slices), normalised, and padded with air up to the patch size
where it is smaller. Patches start on an even grid with at least ``overlap`` between
neighbours (the last patch touches the far edge). Each patch's class *probabilities*
(after ``spec.activation``) are weighted by a Gaussian centred on the patch
(sigma = patch / 8, as nnU-Net) and accumulated; ``finish`` divides by the summed
weights, resamples the probabilities linearly onto the native crop a slab of native
slices at a time, and takes the winner. Outside the crop is background; with an ROI the
label and confidence maps are ROI-sized, on the ROI's sub-grid (see ``BatchedTask``).

Memory: the resampled crop (float32, ``in_channels`` copies) and the class accumulator
(float32, ``classes`` copies) at model spacing are held for the task's life.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from radserve.domain.volume import Volume
from radserve.errors import ModelError
from radserve.host import lazy_zeros
from radserve.inference.slices import check_extra_channels, crop_box
from radserve.inference.tasks import (
    Batch,
    BatchedTask,
    activate,
    check_batch,
    decide,
    pick_batch_size,
)
from radserve.models.manifest import ModelSpec
from radserve.preprocess.crop import BBox, crop_volume
from radserve.preprocess.normalise import normalise, normalised_floor
from radserve.preprocess.resample import grid_coordinates, interpolate_axis, resample_to_spacing

logger = logging.getLogger(__name__)


def window_starts(size: int, patch: int, overlap: float) -> list[int]:
    """Patch start indices covering ``size`` with at least ``overlap`` between neighbours."""
    if size <= patch:
        return [0]
    step = max(1.0, patch * (1.0 - overlap))
    n = math.ceil((size - patch) / step) + 1
    return [round(s) for s in np.linspace(0, size - patch, n)]


def gaussian_weights(patch: tuple[int, int, int], sigma_scale: float = 1 / 8) -> np.ndarray:
    """Importance map: 1 at the patch centre, small but never zero at its faces."""
    axes = []
    for p in patch:
        i = np.arange(p, dtype=np.float64) - (p - 1) / 2.0
        axes.append(np.exp(-0.5 * (i / max(p * sigma_scale, 1e-6)) ** 2))
    g = axes[0][:, None, None] * axes[1][None, :, None] * axes[2][None, None, :]
    g /= g.max()
    return np.maximum(g, 1e-6).astype(np.float32)


class PatchTask(BatchedTask):
    """One study through one 3D model, as a sequence of patch batches."""

    confidence: np.ndarray  # always kept (a slice task keeps it for lesion models only)

    def __init__(
        self,
        volume: Volume,
        spec: ModelSpec,
        roi: BBox | None = None,
        extra_channels: dict[str, np.ndarray] | None = None,
        *,
        crop_to_body: bool = True,
        memory_budget_bytes: int | None = None,
        max_batch_size: int | None = None,
        precision: str = "fp32",
    ) -> None:
        t0 = time.perf_counter()
        if spec.input.mode != "3d" or spec.input.patch_size is None:
            raise ModelError(f"PatchTask runs 3d models; {spec.key} is {spec.input.mode}")
        if spec.input.context_slices:
            raise ModelError(f"model {spec.key}: 3d models take no context_slices")
        self.spec, self.volume, self.precision = spec, volume, precision
        self._budget = memory_budget_bytes
        masks = check_extra_channels(volume, spec, extra_channels)
        self.box = crop_box(volume, spec, roi, crop_to_body)
        self.patch: tuple[int, int, int] = tuple(spec.input.patch_size)  # type: ignore[assignment]
        # Outputs at the ROI's size when there is one (see BatchedTask).
        self._output_grid(self.box, roi is not None)
        self.labels = lazy_zeros(self.grid.shape, np.uint8)
        self.confidence = np.full(self.grid.shape, 255, np.uint8)
        empty = any(s.stop <= s.start for s in self.box)
        self._native_crop = tuple(s.stop - s.start for s in self.box)
        channels = [] if empty else self._model_grid_channels(volume, masks)
        self._image = np.stack(channels) if channels else np.zeros((1, 0, 0, 0), np.float32)
        self._grid = tuple(self._image.shape[1:])  # padded model grid (D, H, W)
        starts = [
            window_starts(n, p, spec.input.overlap)
            for n, p in zip(self._grid, self.patch, strict=True)
        ]
        k = spec.num_classes
        per_patch = 4 * int(np.prod(self.patch)) * (spec.input.in_channels + 3 * k)
        self.batch_size = pick_batch_size(
            spec.input.batch_size, per_patch, memory_budget_bytes, max_batch_size
        )
        self._plan(
            [] if empty else [(z, y, x) for z in starts[0] for y in starts[1] for x in starts[2]]
        )
        self._weights = gaussian_weights(self.patch)
        self._acc = np.zeros((k, *self._grid), np.float32) if self._items else None
        self._norm = np.zeros(self._grid, np.float32) if self._items else None
        self.add_timing("prepare", time.perf_counter() - t0)
        logger.debug(
            "patch task %s: crop %s -> model grid %s, %d patches of %s, batch %d",
            spec.key,
            self._native_crop,
            self._grid,
            len(self._items),
            self.patch,
            self.batch_size,
        )

    def _model_grid_channels(self, volume: Volume, masks: list[np.ndarray]) -> list[np.ndarray]:
        crop = crop_volume(volume, self.box)
        image = resample_to_spacing(crop, self.spec.input.spacing, order=1)
        self._resampled = image.shape
        norm = self.spec.input.normalisation
        channels = [normalise(image.array, norm)]
        for mask in masks:
            m = resample_to_spacing(
                crop.with_array(mask[self.box].astype(np.uint8)), self.spec.input.spacing, order=0
            )
            channels.append(m.array.astype(np.float32))
        # Pad (at the far end) up to one patch where the crop is smaller.
        pad = [(0, max(0, p - n)) for p, n in zip(self.patch, image.shape, strict=True)]
        floor = normalised_floor(norm)
        return [
            np.pad(c, pad, constant_values=floor if i == 0 else 0.0) for i, c in enumerate(channels)
        ]

    def _inputs(self, items: tuple[tuple[int, int, int], ...]) -> np.ndarray:
        """The patches at ``items`` (their origins on the model grid), stacked."""
        pz, py, px = self.patch
        return np.stack([self._image[:, z : z + pz, y : y + py, x : x + px] for z, y, x in items])

    def accept(self, batch: Batch, output: np.ndarray) -> None:
        """Add one batch's Gaussian-weighted probabilities into the accumulator."""
        t0 = time.perf_counter()
        check_batch(self, batch, output, (len(batch.items), self.spec.num_classes, *self.patch))
        self._check_first_output(output)
        probs = activate(output, self.spec.activation)
        probs *= self._weights
        pz, py, px = self.patch
        assert self._acc is not None and self._norm is not None
        for (z, y, x), p in zip(batch.items, probs, strict=True):
            self._acc[:, z : z + pz, y : y + py, x : x + px] += p
            self._norm[z : z + pz, y : y + py, x : x + px] += self._weights
        self._accepted(t0)

    def _map_back(self) -> None:
        """Probabilities at model spacing -> native-grid labels, a slab at a time."""
        assert self._acc is not None and self._norm is not None
        rd, rh, rw = self._resampled
        acc = self._acc[:, :rd, :rh, :rw]
        acc /= self._norm[None, :rd, :rh, :rw]
        d, h, w = self._native_crop
        cz, cy, cx = (grid_coordinates(r, n) for r, n in zip((rd, rh, rw), (d, h, w), strict=True))
        k = self.spec.num_classes
        slab = max(1, (self._budget or 256 * 2**20) // (4 * 3 * k * h * w))
        zs, ys, xs = self._out
        for s in range(0, d, slab):
            coords = cz[s : s + slab]
            lo = max(0, int(np.floor(coords.min())))
            hi = min(rd, int(np.floor(coords.max())) + 2)
            part = interpolate_axis(acc[:, lo:hi], 1, coords - lo, order=1)
            part = interpolate_axis(part, 2, cy, order=1)
            part = interpolate_axis(part, 3, cx, order=1)
            labels, conf = decide(part, self.spec, axis=0)
            z = slice(zs.start + s, zs.start + s + len(coords))
            # Label voxels only: background pages of the map are never made resident.
            np.copyto(self.labels[z, ys, xs], labels, where=labels != 0)
            self.confidence[z, ys, xs] = conf
        self._acc = self._norm = None

    def _complete(self) -> None:
        """Map the accumulated probabilities back (once)."""
        if self._acc is not None:
            t0 = time.perf_counter()
            self._map_back()
            self.add_timing("merge", time.perf_counter() - t0)


__all__ = ["PatchTask", "gaussian_weights", "window_starts"]
