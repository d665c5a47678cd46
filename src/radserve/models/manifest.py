"""``model.yaml``: the contract between a model author and radserve.

A bundle is ``<root>/<name>/<version>/`` holding ``model.yaml`` and the ONNX files it
names. Everything the runtime needs to feed the network and read its output is declared
here, so a site can add an exported nnU-Net/MONAI model without writing Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from radserve.domain.findings import CodedConcept
from radserve.errors import ModelError

# bf16 is the fp32 file run in bfloat16 arithmetic (OpenVINO on a CPU with AMX or
# AVX-512 BF16): declared as ``bf16: model.onnx`` and gated like the file variants.
Precision = Literal["fp32", "fp16", "int8", "bf16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CtWindow(_Strict):
    """Clip to a window and scale to [0, 1]."""

    kind: Literal["ct_window"] = "ct_window"
    center: float
    width: float


class ClipZScore(_Strict):
    """Clip to [lower, upper] then (x - mean) / std."""

    kind: Literal["clip_zscore"] = "clip_zscore"
    lower: float
    upper: float
    mean: float
    std: float = Field(gt=0)


Normalisation = Annotated[CtWindow | ClipZScore, Field(discriminator="kind")]


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
    spacing: tuple[float | None, float, float] = Field(
        description="target (slice, row, column) spacing in mm; slice None keeps native"
    )
    normalisation: Normalisation
    patch_size: tuple[int, ...] | None = Field(
        None, description="3d: sliding-window patch (z, y, x)"
    )
    divisible_by: int = Field(16, ge=1, description="in-plane size padded to a multiple")
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
    roi_margin_mm: float = 10.0
    extra_channels: tuple[str, ...] = Field(
        (), description="upstream label masks appended as input channels"
    )

    @model_validator(mode="after")
    def _check_mode(self) -> InputSpec:
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
        return 2 * self.context_slices + 1 + len(self.extra_channels)


class LabelSpec(_Strict):
    value: int = Field(ge=1)
    name: str
    concept: CodedConcept
    category: CodedConcept
    kind: Literal["organ", "lesion"] = "organ"
    color: tuple[int, int, int] = (255, 0, 0)
    within: tuple[str, ...] = Field(
        (), description="lesion labels: upstream organs a finding must lie in"
    )


class PostprocessSpec(_Strict):
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    min_component_ml: float = Field(0.0, ge=0.0)
    min_confidence: float = Field(0.0, ge=0.0, le=1.0)
    keep_largest: tuple[str, ...] = Field(
        (), description="labels reduced to their largest connected component"
    )


class GateSpec(_Strict):
    """Thresholds a precision variant must meet against FP32 to be served."""

    max_dice_drop: float = 0.01
    max_recall_drop_points: float = 2.0
    # Optional: reject a variant whose false positives per study rise by more than this.
    # None (the default, the gate) only records the change in the gate's notes.
    max_fp_per_study_increase: float | None = Field(default=None, ge=0)


class ModelSpec(_Strict):
    name: str
    version: str
    task: Literal["segmentation", "detection"]
    modality: Literal["CT", "MR"]
    description: str = ""
    input: InputSpec
    activation: Literal["softmax", "sigmoid"] = "softmax"
    labels: tuple[LabelSpec, ...]
    postprocess: PostprocessSpec = PostprocessSpec()
    files: dict[Precision, str] = Field(default_factory=lambda: {"fp32": "model.onnx"})
    gate: GateSpec = GateSpec()

    @model_validator(mode="after")
    def _check_labels(self) -> ModelSpec:
        values = [label.value for label in self.labels]
        if len(set(values)) != len(values):
            raise ValueError("label values must be unique")
        names = {label.name for label in self.labels}
        unknown = set(self.postprocess.keep_largest) - names
        if unknown:
            raise ValueError(f"postprocess.keep_largest names unknown labels {sorted(unknown)}")
        if "fp32" not in self.files:
            raise ValueError("files must name the fp32 model")
        return self

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def num_classes(self) -> int:
        """Output channels including background (softmax) or one per label (sigmoid)."""
        n = max(label.value for label in self.labels)
        return n + 1 if self.activation == "softmax" else n

    def label(self, name: str) -> LabelSpec:
        for label in self.labels:
            if label.name == name:
                return label
        raise KeyError(name)


def load_manifest(path: Path) -> ModelSpec:
    """Parse and validate a ``model.yaml``; errors name the file and the broken field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ModelError(f"cannot read model manifest {path}: {exc}") from exc
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise ModelError(f"invalid model manifest {path}: {exc}") from exc
