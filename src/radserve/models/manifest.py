"""``model.yaml``: the contract between a model author and radserve.

A bundle is ``<root>/<name>/<version>/`` holding ``model.yaml`` and the ONNX files it
names. Everything the runtime needs to feed the network and read its output is declared
here, so a site can add an exported nnU-Net/MONAI model without writing Python.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from radserve.domain.critical import CriticalRule
from radserve.domain.findings import CodedConcept
from radserve.domain.input_domain import InputDomain
from radserve.errors import ModelError
from radserve.models.axes import DEFAULT_AXES, INDEX_AXES, SLICE_AXES, check_axes
from radserve.models.dicom_text import LO_MAX_BYTES, SH_MAX_BYTES, dicom_text
from radserve.models.ops import (
    FINDING_OPS,
    MAP_OPS,
    POSTPROCESS_OPS,
    PREPROCESS_OPS,
    MinConfidence,
    MinSize,
    PostprocessOp,
    PreprocessOp,
    Threshold,
    check_op_names,
    legacy_postprocess,
)
from radserve.validation_text import describe_problems
from radserve.yaml_text import load_yaml_file

# bf16 is the fp32 file run in bfloat16 arithmetic (OpenVINO on a CPU with AMX or
# AVX-512 BF16): declared as ``bf16: model.onnx`` and gated like the file variants.
Precision = Literal["fp32", "fp16", "int8", "bf16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Bounds on a manifest's numbers past which a model cannot be right (session 32: each was
# accepted and then broke every study through the model, or silently fed it NaN):
# intensities a window or statistic names, beyond any modality's values (PET's Bq/ml stay
# under 1e8) and well inside float32, which the images are in (a window 1e-300 wide
# scaled the study to NaN); grid multiples and margins in voxels (divisible_by 1e9 ended
# in numpy's "array is too big"); a patch edge; a target spacing in mm; an RGB component
# (highdicom refused a colour of 300 when writing every SEG, after the inference)
Intensity = Annotated[float, Field(ge=-1e9, le=1e9)]
GridStep = Annotated[int, Field(ge=1, le=1024)]
Voxels = Annotated[int, Field(ge=0, le=1024)]
PatchEdge = Annotated[int, Field(ge=1, le=2048)]
SpacingMm = Annotated[float, Field(gt=0, le=100)]
Rgb = Annotated[int, Field(ge=0, le=255)]

# The largest label value, and so output class, a model may have: radserve's label maps
# are uint8 (the winner map a task decides, the maps cached and handed to the report).
# The one bound the manifest (a label's value, ignored_values) and the nnU-Net and MONAI
# importers refuse by, with this reason: before 2026-12-07 only the importers had it, and
# a hand-written model.yaml with label 256 installed, then labelled every study empty
# (sigmoid: "not found", no warning) or failed each with an OverflowError (softmax).
MAX_LABEL_VALUE = 255
LABEL_MAPS_8_BIT = "radserve label maps are 8-bit"


class CtWindow(_Strict):
    """Clip to a window and scale to [0, 1]."""

    kind: Literal["ct_window"] = "ct_window"
    center: Intensity
    width: float = Field(ge=1e-3, le=2e9)


class ClipZScore(_Strict):
    """Clip to [lower, upper] then (x - mean) / std."""

    kind: Literal["clip_zscore"] = "clip_zscore"
    lower: Intensity
    upper: Intensity
    mean: Intensity
    std: float = Field(ge=1e-6, le=1e9)

    @model_validator(mode="after")
    def _ordered(self) -> ClipZScore:
        if not self.lower < self.upper:
            raise ValueError(
                f"clip_zscore: lower {self.lower:g} must be below upper {self.upper:g}"
            )
        return self


class ZScore(_Strict):
    """Per image: ``(x - mean) / max(std, 1e-8)`` with the mean and std of the float32
    region the model runs on (its crop, before resampling where ``input.resampling`` is
    declared): nnU-Net's ``ZScoreNormalization``. ``use_mask``: the mean and std over
    nnU-Net's non-zero mask (every image channel's non-zero voxels, holes filled) and only
    those voxels normalised, the others left at 0 (nnU-Net's ``use_mask_for_norm``)."""

    kind: Literal["zscore"] = "zscore"
    use_mask: bool = False


class RescaleUnit(_Strict):
    """Per image: ``(x - min) / max(max - min, 1e-8)`` over the region the model runs on
    (nnU-Net's ``RescaleTo01Normalization``)."""

    kind: Literal["rescale_01"] = "rescale_01"


class MonaiIntensityStep(_Strict):
    """One of MONAI's per-image intensity transforms, on one channel, in float32.

    ``normalize`` (``NormalizeIntensity(nonzero)``): ``(x - mean) / std`` with the mean
    and population std of all voxels, or with ``nonzero`` of the voxels != 0 only (the
    others left as they are); a std of 0 divides by 1. ``scale`` (``ScaleIntensity(minv,
    maxv)``): ``(x - min) / (max - min) * (maxv - minv) + minv``; a constant image
    becomes ``x * minv``."""

    op: Literal["normalize", "scale"]
    nonzero: bool = False
    minv: Intensity = 0.0
    maxv: Intensity = 1.0


class MonaiIntensity(_Strict):
    """Per image: MONAI's ``NormalizeIntensity`` / ``ScaleIntensity`` in the bundle's
    order, with statistics over the image the model runs on (the model grid when the
    bundle's ``Spacing`` comes first, the native image when ``resampling.normalise_first``)."""

    kind: Literal["monai_intensity"] = "monai_intensity"
    steps: tuple[MonaiIntensityStep, ...] = Field(min_length=1)


class NoNormalisation(_Strict):
    """The intensities as they are, in float32 (nnU-Net's ``NoNormalization``)."""

    kind: Literal["none"] = "none"


Normalisation = Annotated[
    CtWindow | ClipZScore | ZScore | RescaleUnit | MonaiIntensity | NoNormalisation,
    Field(discriminator="kind"),
]
PER_IMAGE_NORMALISATIONS = (ZScore, RescaleUnit, MonaiIntensity)
"""Normalisations whose numbers come from the image itself: for whole 3d crops only."""


class ResamplingSpec(_Strict):
    """3d models: how the image goes onto the model grid and the outputs come back.

    Absent (the default), radserve resamples the raw image linearly and normalises it
    afterwards. Present, it states nnU-Net's ``resample_data_or_seg_to_shape`` exactly
    (what ``radserve models import nnunet`` writes): the image is normalised first and
    resampled with a spline of ``image_order`` (scikit-image's ``resize``: edge mode, no
    anti-aliasing, clipped to the input's range); outputs (logits or probabilities) come
    back with ``output_order``. With ``separate_z: auto`` an axis whose spacing is more
    than ``anisotropy_threshold`` times the finest (in the source or the target spacing)
    is resampled on its own with ``*_order_z`` after the other two.
    """

    image_order: Literal[0, 1, 3] = 1
    output_order: Literal[0, 1] = 1
    separate_z: Literal["never", "auto"] = "never"
    image_order_z: Literal[0, 1] = 0
    output_order_z: Literal[0, 1] = 0
    anisotropy_threshold: float = Field(3.0, gt=1.0)
    normalise_first: bool = True
    # ``first_voxel`` (what ``radserve models import monai-bundle`` writes): MONAI's
    # ``Spacing(pixdim)`` grid, which keeps the first voxel centre and exactly the target
    # spacing (``round((n - 1) * s / t) + 1`` voxels; new voxel j samples old index
    # ``j * t / s``, edges replicated (``padding_mode: border``), nearest rounds half to
    # even as grid_sample's nearbyint; with patient-direction ``axes`` and order 0 (or
    # ``crop_foreground``) at MONAI's own float64 coordinates, so exact half-voxel ties
    # fall as in MONAI, :mod:`radserve.preprocess.monai_grid`); outputs come back on the
    # inverse map (``Invertd``).
    # ``normalise_first`` is honoured there (``ScaleIntensityRange`` before ``Spacing``).
    grid: Literal["field_of_view", "first_voxel"] = "field_of_view"

    @model_validator(mode="after")
    def _check_grid(self) -> ResamplingSpec:
        if self.grid == "first_voxel" and (self.image_order == 3 or self.separate_z != "never"):
            raise ValueError(
                "resampling.grid 'first_voxel' (MONAI Spacing) takes image_order 0 or 1 and "
                "separate_z 'never'"
            )
        return self


class CropForegroundSpec(_Strict):
    """3d models on MONAI's grid: MONAI's ``CropForeground(d)`` after ``Spacing`` and
    ``ScaleIntensityRange``, as ``radserve models import monai-bundle`` writes it. MONAI's
    labels at native voxels that map exactly onto a model voxel outside the box (all-zero
    outputs) follow the last bit of ``Invertd``'s coordinates; with patient-direction
    ``axes`` radserve computes them as MONAI does (:mod:`radserve.preprocess.monai_grid`).

    On the model grid, after intensity scaling: the box of voxels above ``threshold``
    (MONAI's default ``select_fn``, ``x > 0``), widened by ``margin`` (clamped to the
    image when ``allow_smaller``), then grown to a multiple of ``k_divisible`` around its
    centre (MONAI's ``compute_bounding_box``); outside the image the box is zero. The
    windows are placed inside that box; outputs outside it are zero on the model grid
    before they come back (``Invertd``'s zero padding), then resampled as declared.
    Axes follow ``input.axes``. An image with no voxel above the threshold is an error
    (MONAI's box would be empty)."""

    threshold: float = 0.0
    margin: tuple[Voxels, Voxels, Voxels] = Field((0, 0, 0))
    k_divisible: tuple[GridStep, GridStep, GridStep] = Field((1, 1, 1))
    allow_smaller: bool = False

    @model_validator(mode="after")
    def _check_sizes(self) -> CropForegroundSpec:
        if min(self.margin) < 0 or min(self.k_divisible) < 1:
            raise ValueError("crop_foreground: margin >= 0 and k_divisible >= 1 per axis")
        return self


class SlidingWindowSpec(_Strict):
    """3d models: how patches are weighted, padded and merged.

    ``importance``: ``gaussian`` is radserve's analytic Gaussian (sigma = patch x
    ``sigma_scale``); ``monai_gaussian`` is MONAI's ``compute_importance_map`` (the same
    Gaussian unscaled, raised to at least 1e-3); ``gaussian_filter`` is nnU-Net's (a
    unit impulse at the patch centre blurred by ``scipy.ndimage.gaussian_filter``,
    truncated at 4 sigma, zeros raised to the smallest non-zero weight); ``constant``
    weighs every voxel alike.
    ``accumulate``: what is averaged over overlapping patches: ``probabilities`` (after
    the activation) or ``logits`` (nnU-Net: the activation comes after averaging and
    resampling back). ``pad``: a crop smaller than a patch is padded at its far end with
    the normalised air value (``end_floor``), on both sides with 0 (``centre_zero``,
    nnU-Net's ``pad_nd_image``, MONAI's ``sliding_window_inference``), or on both sides with
    copies of the edge voxels (``centre_edge``, MONAI's ``padding_mode="replicate"``).
    ``placement``:
    patch starts spread evenly with at least ``overlap`` (``even``), or MONAI's
    ``dense_patch_slices`` (``monai``: a step of ``int(patch x (1 - overlap))``, the last
    patch moved back to the far edge). ``activate_on_model_grid`` (logits only): the
    activation runs on the averaged logits at model spacing, before the outputs are
    resampled back (a MONAI bundle's ``Activations`` before its ``Invertd``).
    """

    importance: Literal["gaussian", "monai_gaussian", "gaussian_filter", "constant"] = "gaussian"
    sigma_scale: float = Field(0.125, gt=0)
    accumulate: Literal["probabilities", "logits"] = "probabilities"
    pad: Literal["end_floor", "centre_zero", "centre_edge"] = "end_floor"
    placement: Literal["even", "monai"] = "even"
    activate_on_model_grid: bool = False

    @model_validator(mode="after")
    def _check_activation(self) -> SlidingWindowSpec:
        if self.activate_on_model_grid and self.accumulate != "logits":
            raise ValueError(
                "sliding_window.activate_on_model_grid needs accumulate 'logits' (probabilities "
                "are activated per patch)"
            )
        return self


class TtaSpec(_Strict):
    """Mirroring test-time augmentation baked into the ONNX graph (a record, not a switch).

    ``enabled``: the graph averages the network over every flip combination of
    ``mirror_axes`` (patch axes 0..2), ``cost_factor`` network passes per patch;
    otherwise the axes are those the model allows, not used by this file.
    """

    mirror_axes: tuple[int, ...] = ()
    enabled: bool = False

    @property
    def cost_factor(self) -> int:
        return 2 ** len(self.mirror_axes) if self.enabled else 1


class ChannelSpec(_Strict):
    """One image channel of a multi-series model (``input.channels``: PET/CT,
    multi-sequence MR), taken from the study's series of ``modality`` (and, where given,
    a Series Description matching ``series_description``, a regular expression).

    ``units: SUVbw`` converts a PT series to body-weight SUV from its DICOM headers
    (:mod:`radserve.ingest.suv`; refused with the missing attribute named), the
    reference's too: a PET-only model declares its one channel so (a single-series model
    is fed the series' own units, Bq/ml for a PET). Every channel but the reference is
    resampled (``input.channel_interpolation``) onto the
    reference series' grid, which must share its Frame of Reference; each is normalised
    on its own.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
    modality: str = Field(pattern=r"^[A-Z]{2,4}$", description="DICOM Modality, e.g. CT, PT, MR")
    series_description: str | None = Field(
        None, description="regular expression the Series Description must match (searched)"
    )
    units: Literal["native", "SUVbw"] = "native"
    normalisation: Normalisation

    @model_validator(mode="after")
    def _check_units(self) -> ChannelSpec:
        if self.units == "SUVbw" and self.modality != "PT":
            raise ValueError(f"channel {self.name!r}: units SUVbw need modality PT")
        if self.series_description is not None:
            import re

            try:
                re.compile(self.series_description)
            except re.error as exc:
                raise ValueError(
                    f"channel {self.name!r}: series_description is not a regular expression: {exc}"
                ) from exc
        return self


class InputSpec(_Strict):
    mode: Literal["2d", "2.5d", "3d"]
    context_slices: int = Field(0, ge=0, description="2.5d: neighbours on each side")
    context_mm: float | None = Field(
        None,
        gt=0,
        description=(
            "2.5d: z distance in mm between neighbours (linear between native slices); "
            "None: neighbours are the adjacent native slices"
        ),
    )
    spacing: tuple[SpacingMm | None, SpacingMm, SpacingMm] = Field(
        description="target (slice, row, column) spacing in mm; slice None keeps native"
    )
    normalisation: Normalisation
    patch_size: tuple[PatchEdge, ...] | None = Field(
        None, description="3d: sliding-window patch, in input.axes order (default z, y, x)"
    )
    divisible_by: int = Field(16, ge=1, le=1024, description="in-plane size padded to a multiple")
    batch_size: int = Field(
        8,
        ge=1,
        description=(
            "largest batch per device call; the runtime sends fewer where more gains "
            "nothing (2 on a CPU) or memory does not allow"
        ),
    )
    overlap: float = Field(0.5, ge=0.0, lt=1.0, description="3d sliding-window overlap")
    roi_labels: tuple[str, ...] = Field(
        (), description="restrict inference to the bounding box of these upstream labels"
    )
    roi_margin_mm: float = Field(10.0, ge=0, le=1000)
    extra_channels: tuple[str, ...] = Field(
        (), description="upstream label masks appended as input channels"
    )
    crop: Literal["body", "nonzero", "none"] = Field(
        "body",
        description=(
            "region inference runs on without an ROI: the body (CT; MR runs on all), the "
            "bounding box of non-zero voxels (nnU-Net's crop_to_nonzero) or everything"
        ),
    )
    resampling: ResamplingSpec | None = None
    crop_foreground: CropForegroundSpec | None = None
    sliding_window: SlidingWindowSpec = SlidingWindowSpec()
    test_time_augmentation: TtaSpec = TtaSpec()
    axes: tuple[str, ...] | None = Field(
        None,
        description=(
            "what the network's three axes are (radserve.preprocess.axes): index axes "
            "z (slice), y (row), x (column) in any order, or patient directions as MONAI's "
            "Orientation axcodes, e.g. [R, A, S]; 3d: spacing and patch_size follow this "
            "order (default [z, y, x]); 2d/2.5d: the plane and turn of the slices it was "
            "trained on, the slice axis first (default [S, P, L]: axial, as DICOM shows a "
            "supine head-first patient; [z, y, x] reads slices as stored)"
        ),
    )

    @field_validator("axes")
    @classmethod
    def _check_axes(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else check_axes(value)

    @property
    def network_axes(self) -> tuple[str, ...]:
        """``axes`` as declared, else the mode's default."""
        if self.axes is not None:
            return self.axes
        return DEFAULT_AXES if self.mode == "3d" else SLICE_AXES

    channels: tuple[ChannelSpec, ...] = Field(
        (),
        description=(
            "multi-series models (3d): image channels in network order, each from its own "
            "series; without it the one selected series is the only image channel"
        ),
    )
    reference: str | None = Field(
        None,
        description=(
            "the channel whose series gives the grid the others are resampled onto (and "
            "the outputs are on); default: the first channel. The pipeline must select "
            "that series (series_selection)"
        ),
    )
    channel_interpolation: Literal["nearest", "linear", "cubic"] = Field(
        "linear",
        description=(
            "how the other channels are resampled onto the reference grid: the order the "
            "model's framework resamples images with (nnU-Net imports: cubic, its data "
            "order 3; MONAI imports: their Spacingd mode)"
        ),
    )
    min_channel_coverage: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description=(
            "refuse a study whose channel series images less than this fraction of the "
            "reference grid (one that images none of it is always refused); a channel "
            "covering less than all of it is read as 0 outside and flagged in the report"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _reference_normalisation(cls, data: object) -> object:
        """With ``channels``, ``normalisation`` defaults to the reference channel's."""
        if not isinstance(data, dict) or "normalisation" in data:
            return data
        channels = data.get("channels")
        if not isinstance(channels, list | tuple) or not channels:
            return data
        wanted = data.get("reference")
        named = [c for c in channels if isinstance(c, dict) and c.get("name") == wanted]
        reference = named[0] if named else channels[0]  # an unknown name fails below
        if isinstance(reference, dict) and "normalisation" in reference:
            return {**data, "normalisation": reference["normalisation"]}
        return data

    @model_validator(mode="after")
    def _check_channels(self) -> InputSpec:
        if not self.channels:
            if self.reference is not None:
                raise ValueError("input.reference names a channel, but input.channels is empty")
            return self
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise ValueError(f"input.channels: names must be unique, got {names}")
        if len(self.channels) < 2 and self.channels[0].units != "SUVbw":
            raise ValueError(
                "input.channels declares one channel; leave it out for single-series models "
                "(one channel is for a PET-only model: modality PT, units SUVbw)"
            )
        if self.mode != "3d":
            raise ValueError(f"input.channels are for mode '3d' models, not {self.mode!r}")
        if self.reference is not None and self.reference not in names:
            raise ValueError(f"input.reference {self.reference!r} is not one of {names}")
        return self

    @model_validator(mode="after")
    def _check_per_image(self) -> InputSpec:
        norms = [self.normalisation, *(c.normalisation for c in self.channels)]
        per_image = [n.kind for n in norms if isinstance(n, PER_IMAGE_NORMALISATIONS)]
        if per_image and self.mode != "3d":
            raise ValueError(
                f"normalisation {per_image[0]!r} takes its numbers from the whole image: it "
                f"is for mode '3d' models, not {self.mode!r} (slices are normalised one by one)"
            )
        if any(isinstance(n, ZScore) and n.use_mask for n in norms):
            rs = self.resampling
            if self.crop != "nonzero" or self.roi_labels or rs is None or not rs.normalise_first:
                raise ValueError(
                    "zscore use_mask (nnU-Net's use_mask_for_norm) needs crop 'nonzero', no "
                    "roi_labels, and input.resampling with normalise_first: the mask is the "
                    "non-zero region of the native crop"
                )
        return self

    @property
    def reference_channel(self) -> ChannelSpec | None:
        """The channel whose series is the grid (None: a single-series model)."""
        if not self.channels:
            return None
        wanted = self.reference or self.channels[0].name
        return next(c for c in self.channels if c.name == wanted)

    @model_validator(mode="after")
    def _check_mode(self) -> InputSpec:
        index = self.axes is not None and self.axes[0] in INDEX_AXES
        if self.mode != "3d" and index and self.axes and self.axes[0] != "z":
            raise ValueError(
                f"input.axes {list(self.axes)}: a 2d/2.5d model reads the volume's "
                "slices, so its index axes start with z"
            )
        if self.mode != "3d" and (
            self.resampling is not None
            or self.sliding_window != SlidingWindowSpec()
            or self.crop == "nonzero"
        ):
            raise ValueError("input.resampling, sliding_window and crop 'nonzero' are for 3d")
        if self.crop_foreground is not None and (
            self.resampling is None
            or self.resampling.grid != "first_voxel"
            or self.crop != "none"
            or self.sliding_window.pad != "centre_zero"
            or self.roi_labels
            or self.extra_channels
        ):
            # image channels (input.channels) are fine: MONAI's box is over all of them
            raise ValueError(
                "input.crop_foreground (MONAI's CropForeground) needs resampling.grid "
                "'first_voxel', crop 'none', sliding_window.pad 'centre_zero', and no "
                "extra_channels or roi_labels"
            )
        # spacing[0] null keeps the native slices: radserve's own grid (no resampling, the
        # slice axis first) or nnU-Net's (the native spacing of the network's first axis);
        # MONAI's first_voxel grid has no native spacing to keep
        native = self.resampling is None and (
            self.mode != "3d" or self.network_axes == DEFAULT_AXES
        )
        nnunet = self.resampling is not None and self.resampling.grid == "field_of_view"
        if self.spacing[0] is None and not (native or nnunet):
            raise ValueError(
                "input.spacing[0] null (keep native slices) needs nnU-Net's resampling (grid "
                "'field_of_view') or, without input.resampling, the default input.axes "
                "[z, y, x]; give the spacing of the network's first axis"
            )
        if self.mode == "3d" and (self.patch_size is None or len(self.patch_size) != 3):
            raise ValueError("input.mode '3d' needs a 3-element patch_size")
        if self.mode == "2d" and self.context_slices:
            raise ValueError("input.mode '2d' takes no context_slices; use '2.5d'")
        if self.context_mm is not None and self.mode != "2.5d":
            raise ValueError(f"input.context_mm is for mode '2.5d', not {self.mode!r}")
        if self.context_mm is not None and not self.context_slices:
            raise ValueError("input.context_mm needs context_slices >= 1")
        return self

    @property
    def in_channels(self) -> int:
        images = len(self.channels) if self.channels else 2 * self.context_slices + 1
        return images + len(self.extra_channels)


LabelKind = Literal["organ", "structure", "lesion", "finding", "class"]
"""What a label is, which decides its post-processing (:mod:`radserve.pipeline.volume`):

- ``organ`` / ``structure`` (region kinds): the label map is kept as the step's output,
  each label is measured (volume, mean intensity, coverage: the report's
  ``organ_measurements``), and later steps may name it in ``roi_labels``,
  ``extra_channels`` and ``within``. ``structure`` is the same processing for anatomy
  that is not an organ (vertebrae, vessels, a body-part mask).
- ``lesion`` / ``finding`` (finding kinds): each connected component is one measured
  finding (volume, RECIST diameters, confidence), filtered by ``min_component_ml``,
  ``min_confidence`` and ``within``, numbered in a findings label map. ``finding`` is the
  same processing for what is not a lesion (a nodule in another organ, a calcification).
- ``class`` (the labels of a ``task: classification`` model): no label map; the
  network's class scores, aggregated over the slices it read, name one class with its
  probability (:class:`radserve.domain.Classification`), a finding when it reaches
  ``classification.min_probability``.
"""

REGION_KINDS: frozenset[str] = frozenset({"organ", "structure"})
FINDING_KINDS: frozenset[str] = frozenset({"lesion", "finding"})
CLASS_KINDS: frozenset[str] = frozenset({"class"})


class LabelSpec(_Strict):
    value: int = Field(ge=1)
    name: str
    concept: CodedConcept
    category: CodedConcept
    kind: LabelKind | None = Field(
        None,
        description=(
            "organ | structure | lesion | finding | class; default from the model's task: "
            "'organ' for segmentation, 'lesion' for detection, 'class' for classification"
        ),
    )
    color: tuple[Rgb, Rgb, Rgb] = (255, 0, 0)
    within: tuple[str, ...] = Field(
        (), description="finding labels: upstream region labels a finding must lie in"
    )

    @model_validator(mode="after")
    def _value_fits_label_map(self) -> LabelSpec:
        """A label value is written into uint8 label maps: 1..:data:`MAX_LABEL_VALUE`."""
        if self.value > MAX_LABEL_VALUE:
            raise ValueError(
                f"label {self.name!r} has value {self.value}; label values run 1.."
                f"{MAX_LABEL_VALUE}: {LABEL_MAPS_8_BIT}"
            )
        return self

    @field_validator("name")
    @classmethod
    def _printable_single_value(cls, name: str) -> str:
        """A label name becomes a DICOM value (SEG SegmentLabel, SR text; cut to 64 bytes
        there): :func:`dicom_text`."""
        return dicom_text(name, "label name")

    @field_validator("concept", "category")
    @classmethod
    def _code_fits_dicom(cls, concept: CodedConcept, info: ValidationInfo) -> CodedConcept:
        """The meaning is a CodeMeaning (LO), the scheme a Coding Scheme Designator (SH)."""
        dicom_text(concept.meaning, f"{info.field_name} meaning", max_bytes=LO_MAX_BYTES)
        dicom_text(concept.scheme, f"{info.field_name} scheme", max_bytes=SH_MAX_BYTES)
        dicom_text(concept.value, f"{info.field_name} value")
        return concept

    @property
    def is_region(self) -> bool:
        return self.kind in REGION_KINDS

    @property
    def is_finding(self) -> bool:
        return self.kind in FINDING_KINDS

    @property
    def is_class(self) -> bool:
        return self.kind in CLASS_KINDS


class ClassificationSpec(_Strict):
    """``task: classification``: how per-slice class scores become one study-level class.

    The network maps each (2D / 2.5D) input to one score per class, shape (N, classes):
    softmax models have channel 0 for "none of the labels" and channel ``value`` for each
    label, sigmoid models channel ``value - 1``. Each class's probability is aggregated
    over every slice the model read (``mean``, or ``max`` for a focal sign seen on a few
    slices); the most probable label is the step's class, reported as a finding when its
    probability reaches ``min_probability``.
    """

    aggregate: Literal["mean", "max"] = "mean"
    min_probability: float = Field(0.5, ge=0.0, le=1.0)


class PostprocessSpec(_Strict):
    """The ``postprocess`` mapping model.yaml had before ops (still read: a mapping with
    these keys becomes the equivalent op list, :func:`radserve.models.ops.legacy_postprocess`)."""

    threshold: float = Field(0.5, ge=0.0, le=1.0)
    min_component_ml: float = Field(0.0, ge=0.0)
    min_confidence: float = Field(0.0, ge=0.0, le=1.0)
    keep_largest: tuple[str, ...] = Field(
        (), description="labels reduced to their largest connected component"
    )


class GateSpec(_Strict):
    """Thresholds a precision variant must meet against FP32 to be served."""

    max_dice_drop: float = Field(0.01, ge=0, le=1)
    max_recall_drop_points: float = Field(2.0, ge=0, le=100)
    # Optional: reject a variant whose false positives per study rise by more than this.
    # None (the default, the gate) only records the change in the gate's notes.
    max_fp_per_study_increase: float | None = Field(default=None, ge=0)
    # Every label of the varied model against FP32's own output on the same studies
    # (pooled Dice; a classification step's share of studies answered alike): the check
    # that still measures something where the phantoms' ground truth cannot score a label.
    min_agreement: float = Field(default=0.95, ge=0, le=1)


class RequiresSpec(_Strict):
    """What the host must offer to serve this bundle (``requires:`` in model.yaml).

    Checked at install, by ``radserve doctor`` and when the server starts
    (:mod:`radserve.lifecycle.requirements`); a bundle whose needs the host cannot meet is
    refused with the reason instead of failing on its first study.
    """

    onnxruntime: str | None = Field(
        None, pattern=r"^\d+(\.\d+){0,2}$", description="minimum ONNX Runtime version"
    )
    opset: int | None = Field(None, ge=1, description="ONNX opset the graph needs")
    providers: tuple[str, ...] = Field(
        (), description="execution providers; at least one must be available"
    )
    precision: tuple[Precision, ...] = Field(
        (), description="precisions this bundle must serve at (each must be declared)"
    )
    memory_mb: int | None = Field(None, ge=1, description="free memory one session needs")


def path_segment(value: str, what: str) -> str:
    """``value`` if it can name one folder under the models directory (``<name>/<version>``):
    no path separator, not ``.`` or ``..``, no leading dot (radserve's own folders,
    ``.staging``, ``.installs``, start with one). Before session 35 a bundle's version
    ``../../x`` or name ``/tmp/x`` installed the bundle there, outside the data dir,
    through the API, the CLI and the nnU-Net importer; else ValueError naming ``what``."""
    if "/" in value or "\\" in value or value.startswith(".") or "\x00" in value:
        raise ValueError(
            f"{what} {value[:80]!r} must name one folder: no '/' or '\\', not starting with '.'"
        )
    return value


class ModelSpec(_Strict):
    """A model bundle's manifest.

    ``task`` decides the default ``kind`` of its labels (segmentation: ``organ``,
    detection: ``lesion``, classification: ``class``), and a detection model may declare
    only finding kinds: its output is findings, never a region a later step could rely
    on. A classification model outputs class scores, not a label map (``classification``).
    """

    name: str
    version: str
    task: Literal["segmentation", "detection", "classification"]
    modality: Literal["CT", "MR", "PT"]  # with input.channels: the reference channel's
    description: str = ""
    input: InputSpec
    activation: Literal["softmax", "sigmoid"] = "softmax"
    activation_in_graph: bool = Field(
        False,
        description=(
            "true when the graph applies the activation itself (it ends in Sigmoid or "
            "Softmax, so its output is probabilities): radserve then reads them as they "
            "are. Left false, radserve applies 'activation' to the output, which must be "
            "logits; install refuses a graph ending in Sigmoid/Softmax without this"
        ),
    )
    output: str | None = Field(
        None,
        description=(
            "the name of the graph output to serve (N, classes, spatial...): required when "
            "the graph has more than one output (a deep-supervision head, a score, a copy), "
            "else install refuses it"
        ),
    )
    channel_values: tuple[int, ...] = Field(
        (),
        description=(
            "sigmoid region models (nnU-Net regions_class_order): output channel i writes "
            "label value channel_values[i] where its probability exceeds postprocess.threshold, "
            "later channels over earlier ones"
        ),
    )
    labels: tuple[LabelSpec, ...]
    ignored_values: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        (),
        description=(
            "output class values the network produces that are deliberately not reported "
            "(a training set's 'other' or 'body' class): with the labels, every class the "
            "output has (softmax: channels 1..n-1, channel 0 being background; sigmoid and "
            "classifiers: channel c is value c + 1 (softmax classifiers: c)) must be named "
            "here or be a label, else install and import refuse the bundle"
        ),
    )
    classification: ClassificationSpec | None = Field(
        None, description="task classification: how slice scores become the study's class"
    )
    preprocess: tuple[PreprocessOp, ...] = Field(
        (), description="image ops before inference, in order (radserve.models.ops)"
    )
    postprocess: tuple[PostprocessOp, ...] = Field(
        (), description="label-map and finding ops after inference, in order"
    )
    files: dict[Precision, str] = Field(default_factory=lambda: {"fp32": "model.onnx"})
    gate: GateSpec = GateSpec()
    requires: RequiresSpec = RequiresSpec()
    # what it was trained on; a study outside: flagged or refused (ingest.input_domain)
    input_domain: InputDomain | None = None
    # findings of this model pushed at once to the critical-finding receivers (merged
    # with the pipeline's and the site's rules: radserve.domain.critical)
    critical: tuple[CriticalRule, ...] = ()

    @field_validator("name", "version")
    @classmethod
    def _algorithm_identification(cls, value: str, info: ValidationInfo) -> str:
        """The SEG's and SR's AlgorithmName and AlgorithmVersion (LO): :func:`dicom_text`;
        and a folder of the models directory: :func:`path_segment`."""
        text = dicom_text(value, f"model {info.field_name}", max_bytes=LO_MAX_BYTES)
        return path_segment(text, f"model {info.field_name}")

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, data: object) -> object:
        """YAML reads ``.nan`` and ``.inf`` as floats, and a bound such as ``gt=0`` lets
        infinity through: a spacing, threshold or intensity of NaN/inf is refused here,
        whichever section holds it, naming the field."""
        for where, value in _numbers(data, ""):
            if not math.isfinite(value):
                raise ValueError(f"{where or 'value'} is {value}: numbers must be finite")
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: object) -> object:
        """Labels without ``kind`` take the task's (segmentation: organ; detection: lesion)."""
        if not isinstance(data, dict) or not isinstance(data.get("labels"), list | tuple):
            return data
        default = {"segmentation": "organ", "detection": "lesion", "classification": "class"}.get(
            data.get("task", "")
        )
        if default is None:
            return data
        labels = [
            {**label, "kind": default}
            if isinstance(label, dict) and label.get("kind") is None
            else label
            for label in data["labels"]
        ]
        return {**data, "labels": labels}

    @field_validator("preprocess", mode="before")
    @classmethod
    def _preprocess_ops(cls, value: Any) -> Any:
        return check_op_names(value, "preprocess", PREPROCESS_OPS)

    @field_validator("postprocess", mode="before")
    @classmethod
    def _postprocess_ops(cls, value: Any) -> Any:
        """An op list; the older mapping (threshold, min_component_ml, ...) is read as
        the op list that does the same."""
        if isinstance(value, PostprocessSpec):
            value = value.model_dump()
        if isinstance(value, dict):
            value = legacy_postprocess(value)
        return check_op_names(value, "postprocess", POSTPROCESS_OPS)

    @model_validator(mode="after")
    def _check_ops(self) -> ModelSpec:
        names = {label.name for label in self.labels}
        findings = {label.name for label in self.finding_labels}
        for i, op in enumerate(self.postprocess):
            where = f"postprocess[{i}] ({op.op})"
            if isinstance(op, Threshold) and i != 0:
                raise ValueError(
                    f"{where}: threshold decodes the probabilities, so it must be the "
                    "first postprocess op (and appear once)"
                )
            labels = set(getattr(op, "labels", ()))
            unknown = labels - names
            if unknown:
                raise ValueError(f"{where} names unknown labels {sorted(unknown)}")
            if isinstance(op, FINDING_OPS):
                if not findings:
                    raise ValueError(
                        f"{where} applies to findings, but the model has no finding "
                        "labels (kind lesion/finding)"
                    )
                if labels - findings:
                    raise ValueError(
                        f"{where} applies to findings; labels {sorted(labels - findings)} "
                        "are not of kind lesion/finding"
                    )
        return self

    @model_validator(mode="after")
    def _check_structure_volumes(self) -> ModelSpec:
        """``input_domain.structure_volumes_ml`` and ``structure_hu`` name this model's
        region labels. A model without any (a lesion model) names those of the earlier
        pipeline steps it is judged by, checked when a pipeline is loaded
        (:func:`radserve.pipeline.checks.check_pipeline`)."""
        regions = [label.name for label in self.labels if label.is_region]
        if self.input_domain is None or not regions:
            return self
        for field, name in self.input_domain.named_structures():
            if name not in regions:
                hint = difflib.get_close_matches(name, regions, n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                raise ValueError(
                    f"input_domain.{field} names {name!r}, which is not a region label "
                    f"(kind organ/structure) of this model{suggestion} "
                    f"Its region labels: {regions}"
                )
        return self

    @model_validator(mode="after")
    def _check_critical(self) -> ModelSpec:
        findings = [label.name for label in self.finding_labels]
        for i, rule in enumerate(self.critical):
            if rule.label not in findings:
                raise ValueError(
                    f"rule 'critical labels': critical[{i}] names label {rule.label!r}, which "
                    f"is not a finding label (kind lesion/finding) of this model; its finding "
                    f"labels: {findings or 'none'}"
                )
            if rule.model not in (None, self.name):
                raise ValueError(
                    f"critical[{i}] names model {rule.model!r}: a model.yaml's rules apply "
                    f"to its own findings; leave `model:` out (it is {self.name!r})"
                )
        return self

    @model_validator(mode="after")
    def _check_labels(self) -> ModelSpec:
        if not self.labels:
            # before 2026-12-08 such a model.yaml loaded, and install (HTTP 500), import
            # and the registry failed on its class count with "max() arg is an empty
            # sequence"; nnU-Net's dataset.json of the background alone mapped to it
            raise ValueError(
                "labels is empty: a model needs at least one label, the class its output "
                "reports (a model of none would label nothing in any study)"
            )
        if self.task == "detection":
            regions = [label.name for label in self.labels if label.is_region]
            if regions:
                raise ValueError(
                    f"task 'detection' declares findings only, but labels {regions} have a "
                    "region kind (organ/structure); use task 'segmentation' or kind "
                    "'lesion'/'finding'"
                )
        self._check_classification()
        values = [label.value for label in self.labels]
        if len(set(values)) != len(values):
            raise ValueError("label values must be unique")
        # one name, one structure: measurements, upstream references (roi_labels, within)
        # and a cached result's label values are looked up by name, so a second label of
        # one name (or of names differing in case only) was silently read as the first
        seen: dict[str, str] = {}
        for label in self.labels:
            other = seen.get(label.name.casefold())
            seen[label.name.casefold()] = label.name
            if other is not None:
                raise ValueError(
                    f"label names must be unique: {other!r} and {label.name!r} name two "
                    "labels (names are compared ignoring case)"
                )
        if "fp32" not in self.files:
            raise ValueError("files must name the fp32 model")
        reference = self.input.reference_channel
        if reference is not None and reference.modality != self.modality:
            raise ValueError(
                f"modality {self.modality} differs from the reference channel "
                f"{reference.name!r} ({reference.modality}): the model runs on that series"
            )
        undeclared = set(self.requires.precision) - set(self.files)
        if undeclared:
            raise ValueError(f"requires.precision names undeclared files {sorted(undeclared)}")
        self._check_ignored_values(values)
        if self.channel_values:
            if self.activation != "sigmoid" or self.input.mode != "3d":
                raise ValueError("channel_values need activation 'sigmoid' and input.mode '3d'")
            unknown_values = set(self.channel_values) - set(values)
            if unknown_values:
                raise ValueError(
                    f"channel_values name label values {sorted(unknown_values)} not in labels"
                )
        return self

    def _check_ignored_values(self, values: list[int]) -> None:
        """An ignored value is not a label's, and names a class of the output."""
        above = sorted(v for v in self.ignored_values if v > MAX_LABEL_VALUE)
        if above:
            raise ValueError(
                f"ignored_values {above} are above {MAX_LABEL_VALUE}: {LABEL_MAPS_8_BIT}"
            )
        both = sorted(set(self.ignored_values) & set(values))
        if both:
            raise ValueError(f"ignored_values {both} are label values too; give each once")
        if len(set(self.ignored_values)) != len(self.ignored_values):
            raise ValueError("ignored_values must be unique")
        if self.ignored_values and self.channel_values:
            raise ValueError(
                "ignored_values are for outputs of one class per channel; with "
                "channel_values every channel writes a label value already"
            )

    def _check_classification(self) -> None:
        """A classification model has class labels only, reads slices, and has no label
        map to post-process; class labels belong to classification models only."""
        classes = [label.name for label in self.labels if label.is_class]
        if self.task != "classification":
            if classes:
                raise ValueError(
                    f"labels {classes} are of kind 'class', which only a model of task "
                    "'classification' declares"
                )
            if self.classification is not None:
                raise ValueError("the classification section is for task 'classification'")
            return
        others = [label.name for label in self.labels if not label.is_class]
        if others:
            raise ValueError(
                f"task 'classification' declares class labels only, but labels {others} "
                "have another kind; a classification model writes no label map"
            )
        if self.input.mode == "3d":
            raise ValueError(
                "task 'classification' reads 2d/2.5d slices (one score vector per slice); "
                "input.mode '3d' is not supported for it"
            )
        if self.postprocess:
            raise ValueError(
                "task 'classification' has no label map to post-process; remove postprocess "
                "(classification.min_probability decides when a class is reported)"
            )
        if self.channel_values:
            raise ValueError("channel_values are for sigmoid region models, not classification")

    @property
    def is_classifier(self) -> bool:
        return self.task == "classification"

    @property
    def classifying(self) -> ClassificationSpec:
        """The classification rules (their defaults when model.yaml gives none)."""
        return self.classification or ClassificationSpec()

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def num_classes(self) -> int:
        """Output channels including background (softmax) or one per label (sigmoid), or
        one per region."""
        if self.channel_values:
            return len(self.channel_values)
        n = max(label.value for label in self.labels)
        n = max(n, *self.ignored_values) if self.ignored_values else n
        return n + 1 if self.activation == "softmax" else n

    @property
    def undeclared_values(self) -> tuple[int, ...]:
        """Class values the output can produce that are neither a label nor in
        ``ignored_values`` (labels 1 and 3 of a softmax model leave class 2): voxels or
        slices such a class wins would be reported as nothing. Install and import refuse
        a bundle with any (:func:`radserve.lifecycle.graph_checks.check_onnx`); at run
        time a step whose output has them says so in the report."""
        if self.channel_values:
            return ()
        known = {label.value for label in self.labels} | set(self.ignored_values)
        top = self.num_classes - 1 if self.activation == "softmax" else self.num_classes
        return tuple(v for v in range(1, top + 1) if v not in known)

    @property
    def region_labels(self) -> tuple[LabelSpec, ...]:
        return tuple(label for label in self.labels if label.is_region)

    @property
    def finding_labels(self) -> tuple[LabelSpec, ...]:
        return tuple(label for label in self.labels if label.is_finding)

    @property
    def threshold(self) -> float:
        """The sigmoid decoding threshold (the ``threshold`` op, else 0.5)."""
        first = self.postprocess[0] if self.postprocess else None
        return first.p if isinstance(first, Threshold) else 0.5

    @property
    def map_ops(self) -> tuple[Any, ...]:
        """The postprocess ops on the label map, in order."""
        return tuple(op for op in self.postprocess if isinstance(op, MAP_OPS))

    @property
    def finding_ops(self) -> tuple[Any, ...]:
        """The postprocess ops on findings (min_confidence, nms), in order."""
        return tuple(op for op in self.postprocess if isinstance(op, FINDING_OPS))

    def applies_to(self, op: Any, label: LabelSpec) -> bool:
        """Whether ``op`` acts on ``label`` (its ``labels``, else every label it may:
        finding ops every finding label)."""
        if isinstance(op, FINDING_OPS) and not label.is_finding:
            return False
        return not op.labels or label.name in op.labels

    def min_size_ml(self, label: LabelSpec) -> float:
        """The largest ``min_size`` that applies to ``label`` (0: none)."""
        sizes = [
            op.ml
            for op in self.postprocess
            if isinstance(op, MinSize) and self.applies_to(op, label)
        ]
        return max(sizes, default=0.0)

    def with_finding_rules(
        self, *, min_confidence: float | None = None, min_size_ml: float | None = None
    ) -> ModelSpec:
        """This spec with its label-wide ``min_confidence`` / ``min_size`` ops set to the
        given values (added at the end where absent; 0 removes them): what threshold
        tuning writes back."""
        ops: list[Any] = list(self.postprocess)
        for kind, value, make in (
            (MinConfidence, min_confidence, lambda v: MinConfidence(op="min_confidence", value=v)),
            (MinSize, min_size_ml, lambda v: MinSize(op="min_size", ml=v)),
        ):
            if value is None:
                continue
            at = [i for i, op in enumerate(ops) if isinstance(op, kind) and not op.labels]
            if value <= 0:
                ops = [op for i, op in enumerate(ops) if i not in at]
            elif at:
                ops[at[0]] = make(value)
            else:
                ops.append(make(value))
        return self.model_copy(update={"postprocess": tuple(ops)})

    def served_output_refusal(self, names: Sequence[str]) -> str | None:
        """Why none of a graph's outputs (``names``, in order) can be told to be the one
        served (None: ``output`` names one of them, or there is only one). Before
        2026-12-07 the first output was served whatever the others were: a graph whose
        outputs were (negated logits, logits, score) installed and labelled every study
        inside out. Install refuses it (:func:`radserve.lifecycle.graph_checks.check_onnx`),
        and so does loading it (:class:`radserve.inference.session.ModelSession`)."""
        if self.output is not None:
            if self.output in names:
                return None
            return (
                f"model.yaml's output {self.output!r} is not an output of the graph; its "
                f"outputs: {list(names)}"
            )
        if len(names) == 1:
            return None
        if not names:
            return "the graph has no output"
        return (
            f"the graph has {len(names)} outputs {list(names)} and radserve serves one: name "
            "the one holding the class logits (N, classes, spatial...) in model.yaml as "
            "`output: NAME`"
        )

    def label(self, name: str) -> LabelSpec:
        for label in self.labels:
            if label.name == name:
                return label
        raise KeyError(name)


def _numbers(data: object, where: str) -> Iterator[tuple[str, float]]:
    """Every float in a manifest's raw mapping, with its dotted path (``input.spacing[0]``)."""
    if isinstance(data, float):
        yield where, data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from _numbers(value, f"{where}.{key}" if where else str(key))
    elif isinstance(data, list | tuple):
        for i, value in enumerate(data):
            yield from _numbers(value, f"{where}[{i}]")


def load_manifest(path: Path, *, shown: str | None = None) -> ModelSpec:
    """Parse and validate a ``model.yaml``; errors name the file (``shown``, else its
    path) and the broken field."""
    name = shown or str(path)
    try:
        raw = load_yaml_file(path)
    except (OSError, yaml.YAMLError) as exc:
        raise ModelError(f"cannot read model manifest {name}: {exc}") from exc
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise ModelError(f"invalid model manifest {name}: {describe_problems(exc)}") from exc
