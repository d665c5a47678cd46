"""Output classes a step's model.yaml does not declare, said in the report.

Install and import refuse a bundle whose output has a class that is neither a label nor
in ``ignored_values`` (:func:`radserve.lifecycle.graph_checks.undeclared_class_refusal`).
A bundle installed before that check (or placed in a models folder by hand) may still
have one: the voxels or the study such a class wins were reported as nothing before
2026-12-06 (a softmax model declaring labels 1 and 3 read liver and spleen "not found"
where class 2 won), so a radiologist read a wrong negative. These warnings say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from radserve.domain import Volume
from radserve.models.manifest import ModelSpec
from radserve.preprocess.crop import BBox

_FIX = (
    "declare each as a label in a new version of the model.yaml, or list it in "
    "ignored_values if the class is deliberately not reported"
)


def undeclared_voxels_warning(
    spec: ModelSpec, labels: Volume, boxes: Sequence[BBox | None]
) -> str | None:
    """Why part of ``labels`` (a step's cleaned label map; ``boxes``: of each value
    1..len(boxes)) is not reported, or None: voxels of a value ``spec`` declares neither
    as a label nor as ignored."""
    found: list[str] = []
    for value in spec.undeclared_values:
        box = boxes[value - 1] if value <= len(boxes) else None
        if value <= len(boxes) and box is None:
            continue
        region = labels.array if box is None else labels.array[box]
        count = int(np.count_nonzero(region == value))
        if count:
            found.append(f"{value} ({count * labels.voxel_volume_ml:.1f} ml)")
    if not found:
        return None
    return (
        f"model {spec.key} labelled voxels with class values {', '.join(found)} that its "
        "model.yaml declares neither as labels nor in ignored_values: they are not "
        "reported, so a structure there may read as not found; " + _FIX
    )


def undeclared_class_warning(spec: ModelSpec, probabilities: Mapping[int, float]) -> str | None:
    """Why a classifier's answer may be wrong, or None: a class ``spec`` does not
    declare (``probabilities``: value -> aggregated probability, every output class)
    scored above every declared label (softmax), or reached ``min_probability``
    (sigmoid)."""
    declared = max((probabilities.get(label.value, 0.0) for label in spec.labels), default=0.0)
    floor = spec.classifying.min_probability if spec.activation == "sigmoid" else declared
    winners = [
        f"{value} (p {probabilities[value]:.3f})"
        for value in spec.undeclared_values
        if value in probabilities and probabilities[value] > floor
    ]
    if not winners:
        return None
    return (
        f"classifier {spec.key} scored undeclared class values {', '.join(winners)} "
        f"(its best declared label: p {declared:.3f}): its model.yaml declares them neither "
        "as labels nor in ignored_values, so the class reported may be wrong; " + _FIX
    )


__all__ = ["undeclared_class_warning", "undeclared_voxels_warning"]
