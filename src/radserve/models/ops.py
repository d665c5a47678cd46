"""The processing a model declares: named operations with parameters (``model.yaml``).

``preprocess`` runs on the model's input image before normalisation; ``postprocess``
on its output, in the order written. Each entry is ``{op: <name>, ...parameters}``::

    preprocess:
      - {op: median, size: 3}                  # edge-preserving denoise, in-plane
    postprocess:
      - {op: threshold, p: 0.5}                # sigmoid decoding (first if present)
      - {op: opening, radius_mm: 1.0}          # label map: morphology ...
      - {op: fill_holes, labels: [liver]}
      - {op: min_size, ml: 0.1}                # ... and connected-component rules
      - {op: keep_largest, labels: [liver]}
      - {op: min_confidence, value: 0.8}       # findings: filters and suppression
      - {op: nms, iou: 0.3}

Where each runs and what it costs: :mod:`radserve.preprocess.denoise`,
:mod:`radserve.postprocess.morphology`, :mod:`radserve.postprocess.components`,
:mod:`radserve.postprocess.findings`. Label names are checked against the model's
labels by :class:`~radserve.models.manifest.ModelSpec`; an unknown ``op`` is refused
with the known names and the closest one.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_LABELS_DOC = "labels this applies to (names); empty: every label the op applies to"


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _LabelOp(_Op):
    labels: tuple[str, ...] = Field((), description=_LABELS_DOC)


# --- before inference ------------------------------------------------------------------
class Median(_Op):
    """Median filter in-plane (``size`` x ``size`` pixels, each slice on its own): removes
    the speckle of low-dose CT and keeps edges. Before resampling and normalisation."""

    op: Literal["median"]
    size: int = Field(3, ge=3, le=9)

    @field_validator("size")
    @classmethod
    def _odd(cls, size: int) -> int:
        if size % 2 == 0:
            raise ValueError(f"median size must be odd (3, 5, 7, 9), got {size}")
        return size

    @property
    def reach(self) -> int:
        """Pixels each side an output pixel depends on."""
        return self.size // 2


class Gaussian(_Op):
    """Gaussian smoothing in-plane (``sigma_mm``; not edge-preserving: prefer median for
    low-dose CT). Before resampling and normalisation."""

    op: Literal["gaussian"]
    sigma_mm: float = Field(gt=0, le=10)


PreprocessOp = Annotated[Median | Gaussian, Field(discriminator="op")]

# --- after inference: decoding -------------------------------------------------------------


class Threshold(_Op):
    """Sigmoid models: a voxel is its most probable label where that probability reaches
    ``p`` (else background). Applied while the probabilities are decoded, so it must be
    the first postprocess op; softmax models ignore it (the winner always counts)."""

    op: Literal["threshold"]
    p: float = Field(0.5, ge=0.0, le=1.0)


# --- after inference: the label map ------------------------------------------------------------


class Opening(_LabelOp):
    """Morphological opening (erode, then dilate) by a ball of ``radius_mm``: removes
    spurs and bridges thinner than the ball. Voxels removed become background."""

    op: Literal["opening"]
    radius_mm: float = Field(gt=0, le=20)


class Closing(_LabelOp):
    """Morphological closing (dilate, then erode) by a ball of ``radius_mm``: closes gaps
    narrower than the ball. Only background voxels are added (never another label's)."""

    op: Literal["closing"]
    radius_mm: float = Field(gt=0, le=20)


class FillHoles(_LabelOp):
    """Fill background enclosed by a label (in 3-D, or slice by slice with
    ``in_plane``). Another label's voxels inside it are left alone."""

    op: Literal["fill_holes"]
    in_plane: bool = False


class MinSize(_LabelOp):
    """Remove connected components (26-connectivity) smaller than ``ml``."""

    op: Literal["min_size"]
    ml: float = Field(ge=0)


class KeepLargest(_LabelOp):
    """Keep only the largest connected component of each label."""

    op: Literal["keep_largest"]


# --- after inference: findings (finding labels: lesion / finding) -------------------------------


class MinConfidence(_LabelOp):
    """Drop findings whose mean confidence (the winning probability over the component)
    is below ``value``."""

    op: Literal["min_confidence"]
    value: float = Field(ge=0.0, le=1.0)


class Nms(_LabelOp):
    """Non-maximum suppression of findings: most confident first, a finding whose box
    overlaps an already kept one's by more than ``iou`` (intersection over union of the
    voxel boxes) is dropped. ``across_labels: false`` compares only findings of one
    label."""

    op: Literal["nms"]
    iou: float = Field(gt=0.0, le=1.0)
    across_labels: bool = True


PostprocessOp = Annotated[
    Threshold | Opening | Closing | FillHoles | MinSize | KeepLargest | MinConfidence | Nms,
    Field(discriminator="op"),
]

PREPROCESS_OPS: dict[str, type[_Op]] = {"median": Median, "gaussian": Gaussian}
POSTPROCESS_OPS: dict[str, type[_Op]] = {
    "threshold": Threshold,
    "opening": Opening,
    "closing": Closing,
    "fill_holes": FillHoles,
    "min_size": MinSize,
    "keep_largest": KeepLargest,
    "min_confidence": MinConfidence,
    "nms": Nms,
}
MAP_OPS = (Opening, Closing, FillHoles, MinSize, KeepLargest)
"""Ops on the label map (any label kind), applied by
:func:`radserve.postprocess.components.clean_label_map`."""
FINDING_OPS = (MinConfidence, Nms)
"""Ops on the findings of finding labels, applied by
:func:`radserve.postprocess.findings.find_lesions`."""


def check_op_names(items: Any, field: str, known: dict[str, type[_Op]]) -> Any:
    """Refuse an entry without ``op`` or with an unknown one before pydantic does: its
    message for a discriminated union names neither the entry nor the closest op."""
    if not isinstance(items, list | tuple):
        return items
    for i, item in enumerate(items):
        if isinstance(item, BaseModel):
            continue
        if not isinstance(item, dict):
            raise ValueError(f"{field}[{i}] must be a mapping like {{op: NAME, ...}}, got {item!r}")
        name = item.get("op")
        if name is None:
            raise ValueError(f"{field}[{i}] has no 'op'; known: {', '.join(known)}")
        if name not in known:
            close = difflib.get_close_matches(str(name), list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{field}[{i}]: unknown operation {name!r}{hint} (known: {', '.join(known)})"
            )
    return items


def legacy_postprocess(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The op list equivalent to the pre-op ``postprocess`` mapping (``threshold``,
    ``min_component_ml``, ``min_confidence``, ``keep_largest``): what those keys did,
    in the order the code applied them. Unknown keys are refused by name."""
    known = {"threshold", "min_component_ml", "min_confidence", "keep_largest"}
    extra = sorted(set(section) - known)
    if extra:
        hints = [
            f"{k!r}"
            + (
                f" (did you mean {c[0]!r}?)"
                if (c := difflib.get_close_matches(k, known, n=1))
                else ""
            )
            for k in extra
        ]
        raise ValueError(
            f"postprocess: unknown keys {', '.join(hints)}; write postprocess as a list of "
            f"ops ({', '.join(POSTPROCESS_OPS)}) or use the keys {sorted(known)}"
        )
    ops: list[dict[str, Any]] = [{"op": "threshold", "p": section.get("threshold", 0.5)}]
    if section.get("min_component_ml"):
        ops.append({"op": "min_size", "ml": section["min_component_ml"]})
    if section.get("keep_largest"):
        ops.append({"op": "keep_largest", "labels": list(section["keep_largest"])})
    if section.get("min_confidence"):
        ops.append({"op": "min_confidence", "value": section["min_confidence"]})
    return ops
