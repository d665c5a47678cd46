"""How closely a precision variant reproduces the FP32 model's own output.

The gate's accuracy checks score a pipeline against the phantoms' ground truth: organ
Dice by organ name, lesion recall by size. A model whose labels the phantoms do not know
(an imported nnU-Net or MONAI model, a site's own bundle) or that finds no lesion there
leaves both checks with nothing to measure, and a variant that labels nothing at all
passed them. So every variant is also compared with FP32 on the same studies, label by
label: the Dice of each label's voxels, pooled over the studies (FP32's voxels as the
reference), and for a classification step the share of studies given the same answer.
Pure numpy; the runner feeds it one study at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["CLASS_ANSWER", "AgreementCounter", "StepOutput", "fp32_first"]

_SLAB = 16  # slices a pass holds as int64 pair codes (16 MiB at 512 x 512)
_MAX_PAIRED_VALUES = 1024  # model.yaml label values (a finding-instance map is not one)

CLASS_ANSWER = "class answer"
"""The agreement key of a classification step: the share of studies answered alike."""


def fp32_first(precisions: Sequence[str]) -> list[str]:
    """The order a study runs its precisions in: FP32 first, so each variant's output is
    compared as it comes and dropped (one label map held besides FP32's, not all)."""
    return sorted(precisions, key=lambda p: p != "fp32")


@dataclass(frozen=True)
class StepOutput:
    """One model step's own output for a study: its label map on the CT's grid (values
    as in its model.yaml), or a classification step's answer (label and whether it was
    reported positive)."""

    labels: np.ndarray | None = None
    answer: tuple[str, bool] | None = None


@dataclass
class AgreementCounter:
    """Pooled voxel counts of each label, FP32 against one variant, over studies."""

    names: Mapping[int, str] = field(default_factory=dict)
    _both: dict[int, int] = field(default_factory=dict)
    _sizes: dict[int, int] = field(default_factory=dict)  # FP32 + variant voxels
    _answers: list[bool] = field(default_factory=list)
    _maps: bool = False  # a label map was compared (a classification step has none)

    def add(self, fp32: StepOutput, variant: StepOutput) -> None:
        if fp32.answer is not None or variant.answer is not None:
            self._answers.append(fp32.answer == variant.answer)
        if fp32.labels is None and variant.labels is None:
            return
        if fp32.labels is None or variant.labels is None:
            raise ValueError("one precision's step gave a label map and the other none")
        self._maps = True
        a, b = fp32.labels, variant.labels
        if a.shape != b.shape:
            raise ValueError(f"label maps of shape {a.shape} and {b.shape} cannot be compared")
        width = int(max(a.max(initial=0), b.max(initial=0))) + 1
        if width > _MAX_PAIRED_VALUES:
            raise ValueError(f"a label value of {width - 1} is not a model's class label")
        pairs = np.zeros((width, width), np.int64)
        # (fp32 value, variant value) pairs counted slab by slab: one pass over both maps,
        # and the pair codes of a slab, not of a full-size volume, in memory at once
        flat_a, flat_b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
        for start in range(0, len(flat_a), _SLAB):
            codes = flat_a[start : start + _SLAB].astype(np.int64) * width
            codes += flat_b[start : start + _SLAB]
            pairs += np.bincount(codes.ravel(), minlength=width * width).reshape(width, width)
        for value in range(1, width):
            size = int(pairs[value].sum() + pairs[:, value].sum())
            if size:
                self._both[value] = self._both.get(value, 0) + int(pairs[value, value])
                self._sizes[value] = self._sizes.get(value, 0) + size

    def result(self) -> dict[str, float | None]:
        """Label name -> pooled Dice against FP32 (every label the model declares; None
        where neither precision labelled a voxel of it on any study), and the share of
        studies answered alike for a classification step."""
        out: dict[str, float | None] = dict.fromkeys(self.names.values()) if self._maps else {}
        for value, size in sorted(self._sizes.items()):
            name = self.names.get(value, f"label {value}")
            out[name] = round(2.0 * self._both[value] / size, 6)
        if self._answers:
            out[CLASS_ANSWER] = round(sum(self._answers) / len(self._answers), 6)
        return out
