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

A model imported from nnU-Net declares ``input.resampling`` and ``input.sliding_window``
(see :mod:`radserve.models.manifest`): the crop is then normalised first and resized as
nnU-Net does (:mod:`radserve.preprocess.spline`), padded centred with zeros, weighted
by nnU-Net's filtered Gaussian, and *logits* are averaged; the activation (softmax, or
sigmoid regions) is applied after the logits are resampled back, slab by slab.

A model declaring ``input.axes`` (:mod:`radserve.preprocess.axes`) sees the crop
through a transposed/reversed view in its own axis order; spacing, patches and the
accumulator are in that order, and labels are written back through the same view.

Memory: the resampled crop (float32, ``in_channels`` copies) is held for the task's
life; the class accumulator (float32, ``classes`` copies) is a rolling window of model
slices along the network's first axis (one patch plus one window step deep, grown only
if a batch spans more): once no pending patch touches a slice it is divided by the
summed weights, the native slices that read only such slices are mapped back, and
slices no later native slice reads are dropped. Each voxel sums the same patches in the
same order as one whole-grid accumulator would, so the labels are the same
(``tests/unit/test_inference_rolling.py`` checks them bit for bit).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from radserve.domain.volume import Volume
from radserve.errors import ModelError
from radserve.host import call_on_threads, lazy_zeros
from radserve.inference.slices import check_extra_channels, check_image_channels, crop_box
from radserve.inference.tasks import (
    Batch,
    BatchedTask,
    activate,
    check_batch,
    decide,
    pick_batch_size,
    refuse_nan,
    to_uint8,
)
from radserve.models.manifest import ModelSpec, MonaiIntensity, Normalisation, ZScore
from radserve.preprocess.axes import axis_map
from radserve.preprocess.crop import BBox, crop_volume, nonzero_mask
from radserve.preprocess.denoise import read_filtered
from radserve.preprocess.foreground import foreground_window
from radserve.preprocess.monai_grid import back_coordinates, forward_coordinates
from radserve.preprocess.normalise import normalise, normalised_floor
from radserve.preprocess.resample import (
    DEFAULT_MAX_VOXELS,
    check_grid,
    describe_resampling,
    grid_coordinates,
    interpolate_axis,
    resample_to_spacing,
)
from radserve.preprocess.spline import nnunet_new_shape, resize_channels, separate_axis

logger = logging.getLogger(__name__)
# per network axis, sampling coordinates; MONAI's model grid shape (preprocess.monai_grid)
_Grid = tuple[list[np.ndarray], tuple[int, int, int]]


def window_starts(size: int, patch: int, overlap: float) -> list[int]:
    """Patch start indices covering ``size`` with at least ``overlap`` between neighbours."""
    if size <= patch:
        return [0]
    step = max(1.0, patch * (1.0 - overlap))
    n = math.ceil((size - patch) / step) + 1
    return [round(s) for s in np.linspace(0, size - patch, n)]


def monai_window_starts(size: int, patch: int, overlap: float) -> list[int]:
    """MONAI's ``dense_patch_slices`` starts (``size`` already padded to >= ``patch``): a
    step of ``int(patch * (1 - overlap))`` (at least 1; a whole patch when it fits
    exactly), the last start moved back so the patch ends at the far edge."""
    if size <= patch:
        return [0]
    step = max(1, int(patch * (1 - overlap)))
    n = next(d for d in range(math.ceil(size / step)) if d * step + patch >= size) + 1
    return [min(d * step, size - patch) for d in range(n)]


def monai_gaussian(patch: tuple[int, int, int], sigma_scale: float = 0.125) -> np.ndarray:
    """MONAI's ``compute_importance_map(mode="gaussian")``: ``exp(-x^2 / (2 sigma^2))``
    per axis (x from -(p-1)/2, sigma = p x ``sigma_scale``), multiplied in float32, not
    rescaled, raised to ``max(min, 1e-3)``."""
    g: np.ndarray | None = None
    for i, p in enumerate(patch):
        x = np.arange(-(p - 1) / 2.0, (p - 1) / 2.0 + 1, dtype=np.float32)[:p]
        x = np.exp(x**2 / np.float32(-2 * (p * sigma_scale) ** 2)).astype(np.float32)
        g = x if g is None else g[..., None] * x.reshape((1,) * i + (p,))
    assert g is not None
    return np.maximum(g, max(float(g.min()), 1e-3)).astype(np.float32)


def gaussian_weights(patch: tuple[int, int, int], sigma_scale: float = 1 / 8) -> np.ndarray:
    """Importance map: 1 at the patch centre, small but never zero at its faces."""
    axes = []
    for p in patch:
        i = np.arange(p, dtype=np.float64) - (p - 1) / 2.0
        axes.append(np.exp(-0.5 * (i / max(p * sigma_scale, 1e-6)) ** 2))
    g = axes[0][:, None, None] * axes[1][None, :, None] * axes[2][None, None, :]
    g /= g.max()
    return np.maximum(g, 1e-6).astype(np.float32)


def filtered_gaussian(patch: tuple[int, int, int], sigma_scale: float = 1 / 8) -> np.ndarray:
    """nnU-Net's importance map (``compute_gaussian``): a unit impulse at the patch
    centre (index ``p // 2``) blurred with sigma = patch x ``sigma_scale`` (SciPy's
    filter, truncated at 4 sigma), scaled to a maximum of 1; zeros are raised to the
    smallest non-zero weight."""
    from scipy.ndimage import gaussian_filter

    impulse = np.zeros(patch, dtype=np.float64)
    impulse[tuple(p // 2 for p in patch)] = 1.0
    g = gaussian_filter(impulse, [p * sigma_scale for p in patch], 0, mode="constant", cval=0)
    g /= g.max()
    g = g.astype(np.float32)
    g[g == 0] = g[g > 0].min()
    return g


def importance_map(spec: ModelSpec) -> np.ndarray:
    """The per-voxel patch weight ``spec.input.sliding_window`` declares (read-only:
    one array per patch size and kind, shared by every task of the process)."""
    window = spec.input.sliding_window
    patch: tuple[int, int, int] = tuple(spec.input.patch_size)  # type: ignore[assignment,arg-type]
    return _importance_map(window.importance, patch, window.sigma_scale)


@functools.lru_cache(maxsize=8)
def _importance_map(kind: str, patch: tuple[int, int, int], sigma_scale: float) -> np.ndarray:
    """The map of ``kind``, computed once: nnU-Net's filtered Gaussian of a 128^3 patch
    is a SciPy filter over 2 M voxels in float64 (0.5-2 s here, an eighth of a study's
    preparation; issue 18). nnU-Net caches it the same way (``compute_gaussian``)."""
    if kind == "gaussian_filter":
        weights = filtered_gaussian(patch, sigma_scale)
    elif kind == "constant":
        weights = np.ones(patch, np.float32)
    elif kind == "monai_gaussian":
        weights = monai_gaussian(patch, sigma_scale)
    else:
        weights = gaussian_weights(patch, sigma_scale)
    weights.flags.writeable = False
    return weights


def decide_regions(probs: np.ndarray, spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """Sigmoid region probabilities (channels, ...) -> (uint8 labels, confidence).

    nnU-Net's ``convert_probabilities_to_segmentation`` for regions: channel ``i``
    writes ``spec.channel_values[i]`` where its probability exceeds the threshold, later
    channels over earlier ones. Confidence is the writing channel's probability, or
    ``1 - max p`` for background.
    """
    threshold = spec.threshold
    labels = np.zeros(probs.shape[1:], np.uint8)
    best = 1.0 - probs.max(axis=0)
    refuse_nan(spec, best)  # NaN wherever a region's probability is
    for i, value in enumerate(spec.channel_values):
        hit = probs[i] > threshold
        labels[hit] = value
        best[hit] = probs[i][hit]
    return labels, to_uint8(best)


def _monai_support(
    norm: Normalisation, native: np.ndarray, resample: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray | None:
    """For a first ``NormalizeIntensity(nonzero)`` after MONAI's ``Spacing``: the model
    voxels read from any non-zero native voxel. MONAI decides "non-zero" on its float32
    ``grid_sample`` values, where a sum that cancels leaves ~1e-7, not 0; radserve's
    sums cancel to exactly 0 at other voxels. The support (the resampled non-zero mask
    > 0: no cancellation) is 0 exactly where every voxel read is 0, which both
    implementations give as 0."""
    if not isinstance(norm, MonaiIntensity) or not norm.steps[0].nonzero:
        return None
    return resample((native != 0).astype(np.float32)) > 0


def normalised_channels(pairs: list[tuple[np.ndarray, Normalisation]]) -> list[np.ndarray]:
    """Each image channel of the native crop normalised as declared; a ``use_mask``
    z-score over nnU-Net's non-zero mask of all of them (holes filled), which it takes
    on its crop, as radserve's crop (``crop: nonzero``) is the same box."""
    mask = None
    if any(isinstance(n, ZScore) and n.use_mask for _, n in pairs):
        mask = nonzero_mask([array for array, _ in pairs])
    return [normalise(array, norm, mask) for array, norm in pairs]


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
        image_channels: dict[str, np.ndarray] | None = None,
        merge_threads: int = 1,
        max_voxels: int = DEFAULT_MAX_VOXELS,
    ) -> None:
        """``max_voxels``: the site's ``ingest.max_voxels``; a model grid larger than
        that is refused (``series_too_large``) before it is allocated."""
        t0 = time.perf_counter()
        if spec.input.mode != "3d" or spec.input.patch_size is None:
            raise ModelError(f"PatchTask runs 3d models; {spec.key} is {spec.input.mode}")
        if spec.input.context_slices:
            raise ModelError(f"model {spec.key}: 3d models take no context_slices")
        self.spec, self.volume, self.precision = spec, volume, precision
        self._budget = memory_budget_bytes
        self._max_voxels = max_voxels
        # threads merging a batch: each class's sums, then the final slabs mapped back to
        # the native grid (disjoint slices each)
        self._merge_threads = max(1, merge_threads)
        masks = check_extra_channels(volume, spec, extra_channels)
        self._images = check_image_channels(volume, spec, image_channels)
        others = [array for _, array in self._images if array is not None]
        self.box = crop_box(volume, spec, roi, crop_to_body, others=others)
        self.patch: tuple[int, int, int] = tuple(spec.input.patch_size)  # type: ignore[assignment]
        # Outputs at the ROI's size when there is one (see BatchedTask).
        self._output_grid(self.box, roi is not None)
        self.labels = lazy_zeros(self.grid.shape, np.uint8)
        self.confidence = np.full(self.grid.shape, 255, np.uint8)
        empty = any(s.stop <= s.start for s in self.box)
        # The network's axis order (input.axes): crop, grid and accumulator are in it.
        self._axes = axis_map(spec.input.network_axes, volume.affine)
        self._native_crop = self._axes.shape(tuple(s.stop - s.start for s in self.box))
        channels = [] if empty else self._model_grid_channels(volume, masks)
        if len(channels) == 0:
            self._image = np.zeros((1, 0, 0, 0), np.float32)
        else:
            self._image = channels if isinstance(channels, np.ndarray) else np.stack(channels)
        self._grid = tuple(self._image.shape[1:])  # padded model grid (D, H, W)
        place = (
            monai_window_starts if spec.input.sliding_window.placement == "monai" else window_starts
        )
        origin, size = self._windows or ((0, 0, 0), self._grid)
        starts = [
            [o + z for z in place(n, p, spec.input.overlap)]
            for o, n, p in zip(origin, size, self.patch, strict=True)
        ]
        k = spec.num_classes
        per_patch = 4 * int(np.prod(self.patch)) * (spec.input.in_channels + 3 * k)
        self.batch_size = pick_batch_size(
            spec.input.batch_size, per_patch, memory_budget_bytes, max_batch_size
        )
        self._plan(
            [] if empty else [(z, y, x) for z in starts[0] for y in starts[1] for x in starts[2]]
        )
        self._weights = importance_map(spec)
        self._acc = self._norm = None
        if self._items:
            self._start_accumulator()
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

    _pad_before: tuple[int, int, int] = (0, 0, 0)
    # False: one accumulator for the whole model grid, mapped back at the end (the
    # reference the rolling window is tested against).
    _rolling: bool = True
    _native_spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)
    # input.crop_foreground: the windows' region (start, size) and the box (start, end)
    # on the padded grid (radserve.preprocess.foreground); None: the whole grid.
    _windows: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
    _box: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
    # With patient-direction axes: MONAI's own back-coordinates (None: i * s / t, see
    # _prepare_back).
    _monai_back: list[np.ndarray] | None = None

    def _network_crop(self, volume: Volume) -> Volume:
        """The crop (denoised where declared) in the network's axis order."""
        crop = crop_volume(volume, self.box)
        if self.spec.preprocess:  # in-plane denoise (radserve.preprocess.denoise)
            crop = crop.with_array(
                read_filtered(volume.array, self.box, self.spec.preprocess, volume.spacing[1:])
            )
        crop = self._axes.volume(crop)
        self._native_spacing = crop.spacing
        return crop

    def _model_grid_channels(
        self, volume: Volume, masks: list[np.ndarray]
    ) -> list[np.ndarray] | np.ndarray:
        masks = [self._axes.view(mask[self.box]) for mask in masks]
        rs = self.spec.input.resampling
        if rs is not None and rs.grid == "first_voxel":
            return self._first_voxel_channels(volume, masks)
        if rs is not None:
            return self._nnunet_channels(volume, masks)
        crop = self._network_crop(volume)
        spacing = self.spec.input.spacing
        image = resample_to_spacing(
            crop, spacing, order=1, max_voxels=self._max_voxels, grid=self._model_grid
        )
        self._resampled = image.shape
        channels, floors = [], []
        for array, norm in self._channel_arrays(crop):
            if array is crop.array:  # the reference: already resampled
                grid = image.array
            else:
                grid = resample_to_spacing(
                    crop.with_array(array), spacing, order=1, max_voxels=self._max_voxels
                ).array
            channels.append(normalise(grid, norm))
            floors.append(normalised_floor(norm))
        for mask in masks:
            m = resample_to_spacing(
                crop.with_array(mask.astype(np.uint8)),
                spacing,
                order=0,
                max_voxels=self._max_voxels,
            )
            channels.append(m.array.astype(np.float32))
        # Pad (at the far end) up to one patch where the crop is smaller.
        pad = [(0, max(0, p - n)) for p, n in zip(self.patch, image.shape, strict=True)]
        floors += [0.0] * len(masks)
        return [np.pad(c, pad, constant_values=f) for c, f in zip(channels, floors, strict=True)]

    def _nnunet_channels(self, volume: Volume, masks: list[np.ndarray]) -> np.ndarray:
        """nnU-Net's order: crop, normalise, resize (spline), pad centred with zeros."""
        rs = self.spec.input.resampling
        assert rs is not None
        crop = self._network_crop(volume)
        target = self._nnunet_spacing(crop.spacing)
        shape = nnunet_new_shape(crop.shape, crop.spacing, target)
        self._check_model_grid(shape, crop, target)
        self._resampled = shape
        pairs = self._channel_arrays(crop)
        data = normalised_channels(pairs)
        data += [mask.astype(np.float32) for mask in masks]
        image = resize_channels(
            np.stack(data),
            shape,  # type: ignore[arg-type]
            crop.spacing,
            target,
            order=rs.image_order,
            order_z=rs.image_order_z,
            separate=rs.separate_z == "auto",
            threshold=rs.anisotropy_threshold,
        )
        return self._pad(image, [normalised_floor(n) for _, n in pairs])

    def _check_model_grid(
        self,
        shape: tuple[int, ...],
        crop: Volume,
        target: tuple[float | None, float, float],
    ) -> None:
        """Refuse the model grid ``shape`` of ``crop`` before it is allocated when it is
        larger than the site's ``ingest.max_voxels``: ingest bounded the study at its own
        spacing, and a finer model spacing multiplies it (each channel is a float32 copy
        held for the task's life)."""
        check_grid(
            shape,
            f"{self._model_grid} {describe_resampling(crop.shape, crop.spacing, target)}",
            max_voxels=self._max_voxels,
        )

    @property
    def _model_grid(self) -> str:
        """What a refusal of the model's grid calls it, before the resampling it describes."""
        return f"{self.spec.key} model grid of the crop's"

    def _nnunet_spacing(self, native: tuple[float, ...]) -> tuple[float, float, float]:
        """The model spacing; a null first axis keeps the native one (an nnU-Net 2d
        model: its preprocessing resamples in-plane only, ``[original_spacing[0]] +
        spacing``, and its way back starts from that spacing too)."""
        first, *rest = self.spec.input.spacing
        return (float(native[0]) if first is None else first, *rest)  # type: ignore[return-value]

    def _first_voxel_channels(self, volume: Volume, masks: list[np.ndarray]) -> np.ndarray:
        """MONAI's ``Spacing`` grid (see ``ResamplingSpec.grid``), intensities scaled
        before or after it as the bundle's transforms are ordered."""
        rs = self.spec.input.resampling
        assert rs is not None
        crop = self._network_crop(volume)
        pairs = self._channel_arrays(crop)
        data = (
            normalised_channels(pairs)
            if rs.normalise_first
            else [array.astype(np.float32) for array, _ in pairs]
        )
        data += [mask.astype(np.float32) for mask in masks]
        fg = self.spec.input.crop_foreground
        # MONAI's Spacing coordinates, to the last bit, and the way back (with patient-
        # direction axes, as the importer writes them): their last bit decides labels at
        # the box's zero padding and nearest's half-voxel ties, and MONAI's float32 affine
        # the grid's size (0.75 mm pixels tilted: 32.5 voxels rounds up to 33)
        monai_axes = self._monai_axes() is not None
        if monai_axes:
            image_order = 0 if rs.image_order == 0 else None  # what the coordinates decide
            coords, _ = self._monai_geometry(volume, forward_coordinates, order=image_order)
        else:
            coords = self._first_voxel_coords(crop.shape, crop.spacing, forward=True)
        self._resampled = tuple(len(c) for c in coords)  # type: ignore[assignment]
        self._check_model_grid(self._resampled, crop, self.spec.input.spacing)

        def resampled(c: np.ndarray, order: int) -> np.ndarray:
            # both weights as grid_sample: at a model voxel a few ulps from a native one
            # the neighbour's ~1e-16 weight decides whether NormalizeIntensity(nonzero)
            # counts a voxel just past a zero boundary (lo + w * (hi - lo) drops it)
            for axis, cs in enumerate(coords):
                c = interpolate_axis(
                    c, axis, np.rint(cs) if order == 0 else cs, order=order, both_weights=True
                )
            return c.astype(np.float32, copy=False)

        out = [resampled(c, rs.image_order if i < len(pairs) else 0) for i, c in enumerate(data)]
        if not rs.normalise_first:
            out[: len(pairs)] = [
                normalise(c, n, _monai_support(n, a, lambda m: resampled(m, rs.image_order)))
                for c, (a, n) in zip(out, pairs, strict=False)
            ]
        if fg is not None:
            # MONAI's CropForeground: the windows inside the box, one accumulator for the
            # padded grid (outputs outside the box are zeroed in _finalise).
            window = foreground_window(np.stack(out), fg, self.patch)
            self._pad_before, self._box, self._windows = window.origin, window.box, window.windows
            self._rolling = False
            if monai_axes:
                (start, end), pad = window.box, window.origin
                box = (
                    [a - o for a, o in zip(start, pad, strict=True)],
                    [b - o for b, o in zip(end, pad, strict=True)],
                )
                self._monai_back = self._monai_back_coordinates(volume, box)
            return window.image
        if monai_axes:  # no crop: the whole model grid is the box
            self._monai_back = self._monai_back_coordinates(volume, ([0] * 3, self._resampled))
        return self._pad(np.stack(out), [normalised_floor(n) for _, n in pairs])

    def _monai_axes(self) -> str | None:
        """``Orientation``'s axcodes for MONAI's arithmetic; None for index axes."""
        axes = self.spec.input.network_axes
        if axes is None or any(a not in "RLAPSI" for a in axes):
            return None
        return "".join(axes)

    def _monai_geometry(
        self, volume: Volume, what: Callable[..., _Grid], *args: Any, **kwargs: Any
    ) -> _Grid:
        """``what`` (:mod:`radserve.preprocess.monai_grid`) on the crop as MONAI reads it
        from NIfTI: (per network axis, coordinates; MONAI's model grid shape)."""
        crop = crop_volume(volume, self.box)
        return what(
            crop.nifti_affine(),
            crop.shape[::-1],
            self._monai_axes(),
            self.spec.input.spacing,
            *args,
            **kwargs,
        )

    def _monai_back_coordinates(
        self, volume: Volume, box: tuple[Sequence[int], Sequence[int]]
    ) -> list[np.ndarray]:
        """Where MONAI's ``Invertd`` reads the model grid for each native voxel, to the
        last bit (``box``: the crop box on the unpadded model grid): after
        ``CropForeground`` the labels of voxels landing exactly on a model voxel beside
        the box follow it, and nearest settles half-voxel ties by it (docs/model-ops.md)."""
        rs = self.spec.input.resampling
        assert rs is not None
        # what the coordinates decide: bilinear weights matter only beside the box's zeros
        fg = self.spec.input.crop_foreground
        order = rs.output_order if fg is not None or rs.output_order == 0 else None
        coords, shape = self._monai_geometry(volume, back_coordinates, box, order=order)
        if shape != tuple(self._resampled):
            raise ModelError(
                f"MONAI's exact grid: its Spacing grid {shape} is not radserve's "
                f"{tuple(self._resampled)}"
            )
        return coords

    def _first_voxel_coords(
        self, shape: tuple[int, ...], spacing: tuple[float, ...], *, forward: bool
    ) -> list[np.ndarray]:
        """MONAI ``Spacing`` index maps: model voxel j <- native ``j * t / s`` (forward;
        ``round((n - 1) * s / t) + 1`` of them), native voxel i <- model ``i * s / t``."""
        target: tuple[float, float, float] = tuple(self.spec.input.spacing)  # type: ignore[assignment]
        if not forward:
            return [np.arange(n) * (s / t) for n, s, t in zip(shape, spacing, target, strict=True)]
        sizes = [
            int(np.round((n - 1) * s / t + 1.0))
            for n, s, t in zip(shape, spacing, target, strict=True)
        ]
        return [np.arange(m) * (t / s) for m, s, t in zip(sizes, spacing, target, strict=True)]

    def _pad(self, image: np.ndarray, floors: list[float]) -> np.ndarray:
        """Channels (c, d, h, w) padded up to a patch as ``sliding_window.pad`` says
        (``end_floor``: image channel i with ``floors[i]``, extra channels with 0;
        ``centre_zero``: 0; ``centre_edge``: the edge voxels repeated)."""
        shape = image.shape[1:]
        if self.spec.input.sliding_window.pad == "end_floor":
            pad = [(0, max(0, p - n)) for p, n in zip(self.patch, shape, strict=True)]
            floors = list(floors) + [0.0] * (len(image) - len(floors))
            return np.stack(
                [np.pad(c, pad, constant_values=f) for c, f in zip(image, floors, strict=True)]
            )
        diff = [max(0, p - n) for p, n in zip(self.patch, shape, strict=True)]
        self._pad_before = tuple(d // 2 for d in diff)  # type: ignore[assignment]
        pad = [(0, 0)] + [(d // 2, d - d // 2) for d in diff]
        if not any(diff):
            return image
        if self.spec.input.sliding_window.pad == "centre_edge":
            return np.pad(image, pad, mode="edge")  # MONAI's padding_mode="replicate"
        return np.pad(image, pad, constant_values=0.0)

    def _channel_arrays(self, crop: Volume) -> list[tuple[np.ndarray, Normalisation]]:
        """Each image channel's crop (native grid, the network's axis order) and its
        normalisation, in channel order: the volume's own crop (``crop.array``, the
        reference) and the other series'."""
        if not self._images:
            return [(crop.array, self.spec.input.normalisation)]
        return [
            (
                crop.array if array is None else self._axes.view(array[self.box]),
                channel.normalisation,
            )
            for channel, array in self._images
        ]

    def _inputs(self, items: tuple[tuple[int, int, int], ...]) -> np.ndarray:
        """The patches at ``items`` (their origins on the model grid), stacked."""
        pz, py, px = self.patch
        return np.stack([self._image[:, z : z + pz, y : y + py, x : x + px] for z, y, x in items])

    def accept(self, batch: Batch, output: np.ndarray) -> None:
        """Add one batch's Gaussian-weighted outputs into the rolling accumulator, then
        map back every native slice whose model slices no pending patch touches."""
        t0 = time.perf_counter()
        check_batch(self, batch, output, (len(batch.items), self.spec.num_classes, *self.patch))
        if self.spec.input.sliding_window.accumulate == "logits":
            probs = output  # weighted class by class below (the output is not changed)
        else:
            self._check_first_output(output)
            probs = activate(output, self.spec.activation)
        pz, py, px = self.patch
        assert self._acc is not None and self._norm is not None
        for z, _, _ in batch.items:
            self._reserve(z - self._base + pz)
        acc, norm, weights, base = self._acc, self._norm, self._weights, self._base

        def add_class(c: int) -> None:
            for (z, y, x), sample in zip(batch.items, probs, strict=True):
                region = acc[c, z - base : z - base + pz, y : y + py, x : x + px]
                region += sample[c] * weights

        def add_weights() -> None:
            for z, y, x in batch.items:
                norm[z - base : z - base + pz, y : y + py, x : x + px] += weights

        # each class's sums, and the weights', are arrays of their own: beside a GPU
        # they are added on several threads (numpy lets go of the GIL while adding)
        parts = [functools.partial(add_class, c) for c in range(acc.shape[0])] + [add_weights]
        call_on_threads(parts, self._merge_threads, "radserve-patch-sum")
        for z, _, _ in batch.items:
            self._pending[z] -= 1
        if self._rolling:
            self._drain(next((z for z in sorted(self._pending) if self._pending[z]), None))
        self._accepted(t0)

    # --- the rolling z-slab accumulator ------------------------------------------------
    # ``_acc`` / ``_norm`` hold model-grid slices ``_base`` .. ``_base + rows`` (network
    # axis 0, padded grid). A slice is final once no pending patch starts at or before
    # it; final slices are divided by the summed weights (and activated where declared)
    # once, native slices that need only final slices are mapped back and written, and
    # slices no later native slice needs are dropped. Each voxel sums the same patches in
    # the same order as a whole-volume accumulator, so the labels are the same.

    def _start_accumulator(self) -> None:
        """The window (one patch deep plus one step in z, grown if batches need more)
        and the way back, computed once."""
        k = self.spec.num_classes
        d_grid, h_grid, w_grid = self._grid
        zs = sorted({z for z, _, _ in self._items})
        step = max((b - a for a, b in itertools.pairwise(zs)), default=0)
        rows = d_grid if not self._rolling else min(d_grid, self.patch[0] + step)
        self._acc = np.zeros((k, rows, h_grid, w_grid), np.float32)
        self._norm = np.zeros((rows, h_grid, w_grid), np.float32)
        self._base = 0  # model slice of window row 0
        self._final = 0  # model slices below are final (divided)
        self._next = 0  # next native slice (network axis 0) to map back
        self._pending: dict[int, int] = {}
        for z, _, _ in self._items:
            self._pending[z] = self._pending.get(z, 0) + 1
        self._peak_rows = rows
        self._prepare_back()

    def _reserve(self, rows: int) -> None:
        """Grow the window to ``rows`` slices (batches spanning more z starts)."""
        assert self._acc is not None and self._norm is not None
        have = self._acc.shape[1]
        if rows <= have:
            return
        acc = np.zeros((self._acc.shape[0], rows, *self._acc.shape[2:]), np.float32)
        norm = np.zeros((rows, *self._norm.shape[1:]), np.float32)
        acc[:, :have] = self._acc
        norm[:have] = self._norm
        self._acc, self._norm = acc, norm
        self._peak_rows = max(self._peak_rows, rows)

    def _prepare_back(self) -> None:
        rd, rh, rw = self._resampled
        d, h, w = self._native_crop
        orders = self._output_orders()
        rs = self.spec.input.resampling
        if rs is not None and rs.grid == "first_voxel":
            back = self._monai_back or self._first_voxel_coords(
                (d, h, w), self._native_spacing, forward=False
            )
            # nearest: half to even, as ATen's grid_sample (nearbyint)
            cz, cy, cx = (np.rint(c) if o == 0 else c for c, o in zip(back, orders, strict=True))
        else:
            cz, cy, cx = (
                grid_coordinates(r, n) for r, n in zip((rd, rh, rw), (d, h, w), strict=True)
            )
        self._back = (cz, cy, cx, orders)
        # the model slices (cropped grid) each native slice reads, from .. to (exclusive)
        self._reads_from = np.maximum(0, np.floor(cz)).astype(np.int64)
        self._reads_to = np.minimum(rd, np.floor(cz).astype(np.int64) + 2)

    def _finalise(self, upto: int) -> None:
        """Divide (and activate, where declared) model slices ``_final`` .. ``upto``."""
        assert self._acc is not None and self._norm is not None
        rd, rh, rw = self._resampled
        oz, oy, ox = self._pad_before
        a, b = max(self._final, oz), min(upto, oz + rd)
        if b > a:
            r = slice(a - self._base, b - self._base)
            acc = self._acc[:, r, oy : oy + rh, ox : ox + rw]
            norm = self._norm[None, r, oy : oy + rh, ox : ox + rw]
            inside = None if self._box is None else self._inside_box(a, b)
            if inside is None:
                acc /= norm
            else:  # Invertd pads the cropped outputs with zeros
                np.divide(acc, norm, out=acc, where=inside)
                acc *= inside
            if self.spec.input.sliding_window.activate_on_model_grid:
                acc[...] = activate(acc, self.spec.activation, axis=0)
                if inside is not None:
                    acc *= inside
        self._final = max(self._final, upto)

    def _inside_box(self, a: int, b: int) -> np.ndarray:
        """Whether each voxel of padded-grid slices ``a`` .. ``b`` (the model grid's
        columns and rows) lies in the foreground box."""
        assert self._box is not None
        start, end = self._box
        _, rh, rw = self._resampled
        _, oy, ox = self._pad_before
        axes = [np.arange(a, b), np.arange(rh) + oy, np.arange(rw) + ox]
        inside = [(c >= s) & (c < e) for c, s, e in zip(axes, start, end, strict=True)]
        return inside[0][:, None, None] & inside[1][None, :, None] & inside[2][None, None, :]

    def _drain(self, pending: int | None) -> None:
        """Map back the native slices whose model slices are all final (every one when
        nothing is ``pending``), then drop the slices no later native slice reads."""
        assert self._acc is not None and self._norm is not None
        d_grid = self._grid[0]
        self._finalise(d_grid if pending is None else pending)
        rd, rh, rw = self._resampled
        oz, oy, ox = self._pad_before
        cz, cy, cx, orders = self._back
        d, h, w = self._native_crop
        window = self.spec.input.sliding_window
        logits = window.accumulate == "logits" and not window.activate_on_model_grid
        k = self.spec.num_classes
        width = 4 if self._box is None else 8  # float64 on the crop_foreground way back
        threads = self._merge_threads
        slab = max(1, (self._budget or 256 * 2**20) // (width * 3 * k * h * w * threads))
        zs, ys, xs = self._out
        # Native-grid outputs seen in the network's axis order (views: written through).
        out_labels = self._axes.view(self.labels[zs, ys, xs])
        out_conf = self._axes.view(self.confidence[zs, ys, xs])
        ready = (
            d
            if pending is None
            else int(np.searchsorted(self._reads_to + oz, self._final, "right"))
        )
        both = self._box is not None

        def map_back(s: int, e: int) -> None:
            """Native slices ``s`` .. ``e`` from the final model slices they read."""
            coords = cz[s:e]
            lo = max(0, int(np.floor(coords.min())))
            hi = min(rd, int(np.floor(coords.max())) + 2)
            rows = slice(oz + lo - self._base, oz + hi - self._base)
            acc = self._acc[:, rows, oy : oy + rh, ox : ox + rw]
            if both:
                # Invertd: float64 weights of both neighbours (a weight of 1e-16 on an
                # in-box voxel beside the zeros decides the label there), then float32.
                acc = acc.astype(np.float64)
            part = interpolate_axis(acc, 1, coords - lo, order=orders[0], both_weights=both)
            part = interpolate_axis(part, 2, cy, order=orders[1], both_weights=both)
            part = interpolate_axis(part, 3, cx, order=orders[2], both_weights=both)
            part = part.astype(np.float32, copy=False)
            if logits:
                part = activate(part, self.spec.activation, axis=0)
            if self.spec.channel_values:
                labels, conf = decide_regions(part, self.spec)
            else:
                labels, conf = decide(part, self.spec, axis=0)
            # Label voxels only: background pages of the map are never made resident.
            np.copyto(out_labels[s:e], labels, where=labels != 0)
            out_conf[s:e] = conf

        # each slab reads the final model slices and writes native slices of its own
        slabs = [
            functools.partial(map_back, s, min(ready, s + slab))
            for s in range(self._next, ready, slab)
        ]
        call_on_threads(slabs, threads, "radserve-patch-merge")
        self._next = max(self._next, ready)
        if self._next >= d:
            self._acc = self._norm = None
            return
        keep = min(oz + int(self._reads_from[self._next]), self._final)
        self._drop(keep - self._base)

    def _drop(self, rows: int) -> None:
        """Forget the window's first ``rows`` slices (moving the rest to its start)."""
        assert self._acc is not None and self._norm is not None
        if rows <= 0:
            return
        n = self._acc.shape[1]
        rows = min(rows, n)
        for i in range(n - rows):  # a slice at a time: no copy of the window
            self._acc[:, i] = self._acc[:, i + rows]
            self._norm[i] = self._norm[i + rows]
        self._acc[:, n - rows :] = 0.0
        self._norm[n - rows :] = 0.0
        self._base += rows

    def _output_orders(self) -> tuple[int, int, int]:
        """Interpolation order per axis bringing outputs back (linear unless declared)."""
        rs = self.spec.input.resampling
        if rs is None:
            return (1, 1, 1)
        orders = [rs.output_order] * 3
        if rs.separate_z == "auto":
            model = self._nnunet_spacing(self._native_spacing)
            axis = separate_axis(model, self._native_spacing, rs.anisotropy_threshold)
            if axis is not None:
                orders[axis] = rs.output_order_z
        return tuple(orders)  # type: ignore[return-value]

    def _complete(self) -> None:
        """Map back whatever is left (everything, without the rolling window)."""
        if self._acc is not None:
            t0 = time.perf_counter()
            self._drain(None)
            self.add_timing("merge", time.perf_counter() - t0)


__all__ = [
    "PatchTask",
    "decide_regions",
    "filtered_gaussian",
    "gaussian_weights",
    "importance_map",
    "window_starts",
]
