"""2D / 2.5D models: batches of native slices in, a native-grid label map out.

Per batch: crop every native slice the batch reads in-plane to the ROI (or the body for
CT), apply the model's ``preprocess`` ops (:mod:`radserve.preprocess.denoise`) and
resample it in-plane to ``spec.input.spacing`` (linear, on HU), once; take each
slice's 2.5D context from those (``context_slices`` neighbours each side, by
:func:`radserve.preprocess.context.context_positions`: adjacent native slices, or
every ``context_mm`` along z interpolated between native slices; clamped at the
volume's ends), normalise, pad symmetrically to ``divisible_by`` with the normalised
floor (air). Extra channels (bool masks of upstream labels) go through the same crop
and nearest-neighbour resampling and follow the image channels in
``spec.input.extra_channels`` order.

Back: drop the padding, apply the activation, resample the class probabilities
linearly onto the native crop and take the winner (every class is interpolated only
at label boundaries: :mod:`radserve.inference.upsample`), and write uint8 labels and
confidences into preallocated arrays: native-size, or ROI-size on the ROI's sub-grid
when the task has an ROI. Everything outside the crop is background (label 0,
confidence 255). Only one batch of probabilities exists at a time per task.

Through-plane spacing: 2D/2.5D models run on native slices; a model.yaml with a
non-None slice spacing in these modes is refused (``ModelError``).

Orientation: each native crop is turned in-plane to the network's axes (``input.axes``,
by default axial as DICOM shows a supine head-first patient) before it is resampled, its
2.5D context read in reverse where the slices run the other way, and every output turned
back before it is written (:func:`radserve.preprocess.axes.slice_plane`). Before session
36 a prone, feet-first or transposed study reached the network as stored: wrong organs,
missed lesions and left and right swapped, with no warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from radserve.domain.volume import Volume
from radserve.errors import ModelError, PipelineError
from radserve.host import lazy_zeros
from radserve.inference.tasks import (
    Batch,
    BatchedTask,
    ForegroundBox,
    activate,
    check_batch,
    pick_batch_size,
)
from radserve.inference.upsample import UpsampledDecision
from radserve.models.manifest import ChannelSpec, ModelSpec
from radserve.preprocess.axes import AxisMap, slice_plane
from radserve.preprocess.context import context_positions, context_step, sample_slices
from radserve.preprocess.crop import (
    BBox,
    bbox_of_mask,
    body_bbox,
    body_sample_slices,
    nonzero_mask,
)
from radserve.preprocess.denoise import read_filtered
from radserve.preprocess.normalise import normalise, normalised_floor
from radserve.preprocess.resample import (
    DEFAULT_MAX_VOXELS,
    check_grid,
    describe_resampling,
    grid_coordinates,
    interpolate_axis,
    resampled_size,
)

logger = logging.getLogger(__name__)


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class ArrivingSlices(Protocol):
    """A volume still being decoded (:class:`radserve.ingest.arrival.SliceArrival`)."""

    def wait(self, slices: Iterable[int]) -> None: ...

    def wait_range(self, start: int, stop: int) -> None: ...

    def wait_all(self) -> None: ...


def crop_box(
    volume: Volume,
    spec: ModelSpec,
    roi: BBox | None,
    crop_to_body: bool,
    arrival: ArrivingSlices | None = None,
    others: Sequence[np.ndarray] = (),
) -> BBox:
    """The region a model runs on: the ROI if given, else the body for CT, else all.

    ``arrival``: the volume is still being decoded; only the slices the box is made
    from are waited for (all of them, but for the body box). ``others``: the model's
    other image channels on the volume's grid; ``crop: nonzero`` boxes the voxels
    non-zero in any channel, as nnU-Net's ``crop_to_nonzero`` does."""
    if arrival is not None and not (
        roi is None and crop_to_body and spec.input.crop == "body" and spec.modality == "CT"
    ):
        arrival.wait_all()
    if roi is not None:
        return tuple(  # type: ignore[return-value]
            slice(max(0, s.start or 0), min(n, n if s.stop is None else s.stop))
            for s, n in zip(roi, volume.shape, strict=True)
        )
    if crop_to_body and spec.input.crop == "nonzero":
        mask = nonzero_mask([volume.array, *others], fill_holes=False)
        return bbox_of_mask(mask) or (slice(0, 0), slice(0, 0), slice(0, 0))
    if crop_to_body and spec.input.crop == "body" and spec.modality == "CT":
        if arrival is not None:
            arrival.wait(body_sample_slices(volume.shape, volume.spacing))
        return body_bbox(volume)
    return tuple(slice(0, n) for n in volume.shape)  # type: ignore[return-value]


def check_extra_channels(
    volume: Volume, spec: ModelSpec, extra: dict[str, np.ndarray] | None
) -> list[np.ndarray]:
    """The masks ``spec.input.extra_channels`` names, in order, checked against the volume."""
    extra = extra or {}
    missing = [name for name in spec.input.extra_channels if name not in extra]
    if missing:
        raise PipelineError(
            f"model {spec.key} needs upstream label masks {missing} as extra input "
            f"channels, got {sorted(extra)}; run the upstream model first in the pipeline"
        )
    masks = [np.asarray(extra[name]) for name in spec.input.extra_channels]
    for name, mask in zip(spec.input.extra_channels, masks, strict=True):
        if mask.shape != volume.shape:
            raise PipelineError(
                f"extra channel {name!r} has shape {mask.shape}, volume is {volume.shape}"
            )
    return masks


_PREPARE_SLICES = 2  # slices made into network input at once


def check_image_channels(
    volume: Volume, spec: ModelSpec, images: dict[str, np.ndarray] | None
) -> list[tuple[ChannelSpec, np.ndarray | None]]:
    """``spec.input.channels`` in order with their arrays on ``volume``'s grid (None for
    the reference channel: ``volume`` itself, unless ``images`` holds it converted, a PET
    in SUVbw); empty for a single-series model."""
    channels = spec.input.channels
    images = images or {}
    if not channels:
        if images:
            raise ModelError(
                f"model {spec.key} declares no input.channels but was given {sorted(images)}"
            )
        return []
    reference = spec.input.reference_channel
    out: list[tuple[ChannelSpec, np.ndarray | None]] = []
    for channel in channels:
        array = images.get(channel.name)
        if reference is not None and channel.name == reference.name and array is None:
            out.append((channel, None))
            continue
        if array is None:
            raise ModelError(
                f"model {spec.key} needs input channel {channel.name!r} ({channel.modality}) "
                f"on the reference grid, got {sorted(images)}"
            )
        if array.shape != volume.shape:
            raise ModelError(
                f"input channel {channel.name!r} has shape {array.shape}, the reference "
                f"volume is {volume.shape}: resample it onto the reference grid first"
            )
        out.append((channel, array))
    return out


class SliceTask(BatchedTask):
    """One study through one 2D/2.5D model, as a sequence of slice batches."""

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
        arrival: ArrivingSlices | None = None,
        max_voxels: int = DEFAULT_MAX_VOXELS,
    ) -> None:
        """``max_voxels``: the site's ``ingest.max_voxels``; the crop's slices at the
        model's spacing, all together, may hold no more (``series_too_large``)."""
        t0 = time.perf_counter()
        if spec.input.mode not in ("2d", "2.5d"):
            raise ModelError(f"SliceTask runs 2d/2.5d models; {spec.key} is {spec.input.mode}")
        if spec.input.spacing[0] is not None:
            raise ModelError(
                f"model {spec.key}: input.spacing[0] = {spec.input.spacing[0]} but "
                f"{spec.input.mode} models run on native slices; set it to null"
            )
        self.spec = spec
        self.volume = volume
        self.precision = precision
        # a volume still being decoded: each batch waits for the slices it reads
        self._arrival = arrival
        # the network's turn of each native slab (z, rows, columns), and back
        plane = slice_plane(spec.input.network_axes, volume.affine, spec.key)
        in_plane = AxisMap(plane.perm, (False, plane.flip[1], plane.flip[2]))
        self._turn, self._unturn = in_plane.view, in_plane.inverse().view
        self._reverse_context = plane.flip[0]  # the slices run the other way
        self._extra = check_extra_channels(volume, spec, extra_channels)
        self.box = crop_box(volume, spec, roi, crop_to_body, arrival)
        zs, ys, xs = self.box
        # the crop's rows and columns, and their spacings, as the network sees them
        _, self._h, self._w = in_plane.shape((0, ys.stop - ys.start, xs.stop - xs.start))
        row_mm, column_mm = (volume.spacing[axis] for axis in in_plane.perm[1:])
        target = spec.input.spacing
        self._rh = (
            resampled_size(self._h, row_mm, target[1], max_voxels=max_voxels) if self._h else 0
        )
        self._rw = (
            resampled_size(self._w, column_mm, target[2], max_voxels=max_voxels) if self._w else 0
        )
        # resampled a batch at a time, the slices at the model's spacing are still the
        # work of one volume of this many voxels: bounded as a 3d model's grid is, so that
        # a model spacing far below the study's cannot step past the site's bound
        planned = (zs.stop - zs.start, self._rh, self._rw)
        check_grid(
            planned,
            f"{spec.key} model grid of the crop's "
            + describe_resampling(
                (planned[0], self._h, self._w), (volume.spacing[0], row_mm, column_mm), target
            ),
            max_voxels=max_voxels,
        )
        k = spec.input.divisible_by
        self._ph, self._pw = _round_up(self._rh, k), _round_up(self._rw, k)
        self._pad_y = (self._ph - self._rh) // 2
        self._pad_x = (self._pw - self._rw) // 2
        self.batch_size = pick_batch_size(
            spec.input.batch_size, self.bytes_per_slice(), memory_budget_bytes, max_batch_size
        )
        self._plan(range(zs.start, zs.stop) if self._h and self._w else [])
        n = len(self._items)
        # Outputs at the ROI's size when there is one (see BatchedTask).
        self._foreground = ForegroundBox()  # the tight box of what accept() writes
        self._output_grid(self.box, roi is not None)
        self._out_z0 = self._out[0].start - zs.start
        self.labels = lazy_zeros(self.grid.shape, np.uint8)
        # Confidence only matters where findings are measured: organ models skip it.
        self.confidence: np.ndarray | None = (
            np.full(self.grid.shape, 255, np.uint8) if spec.finding_labels else None
        )
        self._floor = normalised_floor(spec.input.normalisation)
        # (first slice, stack) of the last batch's resampled native slices.
        self._last_stack: tuple[int, np.ndarray] = (0, np.empty((0, 0, 0), np.float32))
        self._step = context_step(spec.input.context_mm, volume.spacing[0])
        # Resampling coordinates, computed once: model grid <- native crop and back.
        self._fwd_y = grid_coordinates(self._h, self._rh) if n else None
        self._fwd_x = grid_coordinates(self._w, self._rw) if n else None
        self._back = (
            UpsampledDecision(
                grid_coordinates(self._rh, self._h),
                self._rh,
                grid_coordinates(self._rw, self._w),
                self._rw,
            )
            if n
            else None
        )
        self.add_timing("prepare", time.perf_counter() - t0)
        logger.debug(
            "slice task %s: %d slices, crop %s -> model %dx%d (padded %dx%d), batch %d",
            spec.key,
            n,
            (self._h, self._w),
            self._rh,
            self._rw,
            self._ph,
            self._pw,
            self.batch_size,
        )

    # --- sizes --------------------------------------------------------------------------
    def bytes_per_slice(self) -> int:
        """Working set of one slice: input, logits, and probabilities on both grids."""
        c, k = self.spec.input.in_channels, self.spec.num_classes
        model_px, native_px = self._ph * self._pw, self._h * self._w
        return 4 * (c * model_px + 2 * k * model_px + 3 * k * native_px)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of each sample fed to the network."""
        return (self.spec.input.in_channels, self._ph, self._pw)

    # --- batches ------------------------------------------------------------------------
    def _inputs(self, items: tuple[int, ...]) -> np.ndarray:
        """The network input for the native slices ``items``.

        Every native slice the batch reads (its own and its neighbours) is cropped and
        resampled in-plane once (:meth:`_resampled_stack`); the 2.5D context is then
        gathered from the resampled stack, where a neighbour read by several samples
        costs nothing more. Both steps are linear, so this is the training order
        (gather, then resample) up to float rounding, and exactly it for whole-slice
        neighbours.
        """
        _, ys, xs = self.box
        n_img = 2 * self.spec.input.context_slices + 1
        py = slice(self._pad_y, self._pad_y + self._rh)
        px = slice(self._pad_x, self._pad_x + self._rw)
        out = np.empty((len(items), *self.input_shape), np.float32)
        out[:, :n_img] = self._floor  # image padding is air
        out[:, n_img:] = 0.0  # mask padding is outside every label
        positions = context_positions(
            items, self.spec.input.context_slices, self._step, self.volume.shape[0]
        )
        if self._reverse_context:  # the network's neighbour "before" is the next slice
            positions = positions[:, ::-1]
        first = int(np.floor(positions.min()))
        stack = self._resampled_stack(first, int(np.ceil(positions.max())))
        for j in range(len(items)):
            image = sample_slices(stack, positions[j] - first)
            out[j, :n_img, py, px] = normalise(image, self.spec.input.normalisation)
        rows = np.asarray(items)
        for j, mask in enumerate(self._extra):
            m = self._to_model_grid(self._turn(mask[rows, ys, xs])[:, None], order=0)
            out[:, n_img + j, py, px] = m[:, 0]
        return out

    def _resampled_stack(self, first: int, last: int) -> np.ndarray:
        """Native slices ``first..last``, cropped and resampled in-plane (float32).

        Batches come in slice order and their context overlaps (a 2.5D batch of two
        slices with +-2.5 mm of context on 1 mm slices reads eight), so the previous
        batch's stack is kept and only slices it lacks are resampled,
        ``_PREPARE_SLICES`` at a time (the float32 crops and their resampling
        temporaries are the largest arrays of this stage).
        """
        _, ys, xs = self.box
        stack = np.empty((last - first + 1, self._rh, self._rw), np.float32)
        kept_first, kept = self._last_stack
        lo, hi = max(first, kept_first), min(last, kept_first + len(kept) - 1)
        if lo <= hi:
            stack[lo - first : hi - first + 1] = kept[lo - kept_first : hi - kept_first + 1]
            missing = [(first, lo - 1), (hi + 1, last)]
        else:
            missing = [(first, last)]
        for start, stop in missing:
            for z in range(start, stop + 1, _PREPARE_SLICES):
                if self._arrival is not None:
                    self._arrival.wait_range(z, min(stop + 1, z + _PREPARE_SLICES))
                part = read_filtered(
                    self.volume.array,
                    (slice(z, min(stop + 1, z + _PREPARE_SLICES)), ys, xs),
                    self.spec.preprocess,
                    self.volume.spacing[1:],
                )
                turned = self._turn(part).astype(np.float32)
                resampled = self._to_model_grid(turned[:, None], order=1)
                stack[z - first : z - first + len(part)] = resampled[:, 0]
                del resampled
        self._last_stack = (first, stack)
        return stack

    def _to_model_grid(self, array: np.ndarray, *, order: int) -> np.ndarray:
        out = array
        if self._rh != self._h:
            out = interpolate_axis(out, 2, self._fwd_y, order=order)
        if self._rw != self._w:
            out = interpolate_axis(out, 3, self._fwd_x, order=order)
        return out

    def _extent(self) -> BBox:
        return self._foreground.box()

    def accept(self, batch: Batch, output: np.ndarray) -> None:
        """Map one batch's logits back onto the native grid, slice for slice."""
        t0 = time.perf_counter()
        n, k = len(batch.items), self.spec.num_classes
        check_batch(self, batch, output, (n, k, self._ph, self._pw))
        logits = output[
            :, :, self._pad_y : self._pad_y + self._rh, self._pad_x : self._pad_x + self._rw
        ]
        self._check_first_output(logits)
        _, ys, xs = self._out
        # One slice at a time; class probabilities stay on the model grid (only boundary
        # pixels get every class at full resolution: UpsampledDecision).
        for j, item in enumerate(batch.items):
            probs = activate(logits[j], self.spec.activation, axis=0)
            labels, conf = self._back(probs, self.spec, confidence=self.confidence is not None)
            labels = self._unturn(labels[None])[0]
            conf = None if conf is None else self._unturn(conf[None])[0]
            z = int(item) + self._out_z0
            # Only label voxels are written: the map starts as untouched zero pages, and
            # pages that only background would fill stay unallocated (most of a lesion
            # map, the air and fat of an organ map).
            foreground = labels != 0
            np.copyto(self.labels[z, ys, xs], labels, where=foreground)
            self._foreground.add(z, foreground, ys.start, xs.start)
            if self.confidence is not None and conf is not None:
                self.confidence[z, ys, xs] = conf
        self._accepted(t0)


__all__ = [
    "ArrivingSlices",
    "SliceTask",
    "check_extra_channels",
    "check_image_channels",
    "crop_box",
]
