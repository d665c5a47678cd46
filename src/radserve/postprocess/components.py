"""Connected-component clean-up of a label map: drop specks, keep the largest organ piece.

Models leave small false-positive islands and fragment organs; the manifest's
``postprocess`` section says what to remove. Everything here is vectorised over
components (cc3d + ``np.bincount``), and works inside the bounding box of the
foreground so sparse lesion maps cost little even on 512 x 512 x 300 volumes.
"""

from __future__ import annotations

import logging

import cc3d
import numpy as np

from radserve.models.manifest import ModelSpec
from radserve.preprocess.crop import label_bboxes

logger = logging.getLogger(__name__)

CONNECTIVITY = 26
"""Voxels touching by a face, edge or corner belong to one component (3-D)."""


def foreground_bbox(mask: np.ndarray) -> tuple[slice, ...] | None:
    """Smallest box holding every non-zero voxel, or None when there are none.

    Three axis reductions are far cheaper than ``np.argwhere`` on a full volume.
    """
    boxes: list[slice] = []
    for axis in range(mask.ndim):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        hits = np.flatnonzero(np.any(mask, axis=others))
        if hits.size == 0:
            return None
        boxes.append(slice(int(hits[0]), int(hits[-1]) + 1))
    return tuple(boxes)


def label_components(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Multi-label connected components (cc3d never joins voxels of different labels).

    Returns ``(components, component_label, counts)``: the component id of each voxel
    (0 is background), and indexed by component id the label value it belongs to and
    its voxel count. Counting runs over foreground voxels only: ``np.bincount`` over a
    whole 78 M-voxel volume costs ~1 s, over its foreground a fraction of that.
    """
    components, n = cc3d.connected_components(labels, connectivity=CONNECTIVITY, return_N=True)
    component_label = np.zeros(n + 1, dtype=labels.dtype)
    counts = np.zeros(n + 1, dtype=np.int64)
    if n:
        fg = np.flatnonzero(components)
        ids = components.ravel()[fg]
        component_label[ids] = labels.ravel()[fg]
        counts = np.bincount(ids, minlength=n + 1)
    return components, component_label, counts


def clean_labels(
    labels: np.ndarray, spec: ModelSpec, voxel_volume_ml: float, *, in_place: bool = False
) -> np.ndarray:
    """Apply the manifest's component rules; returns the cleaned map (same dtype).

    - components smaller than ``postprocess.min_component_ml`` are removed (every label);
    - labels named in ``postprocess.keep_largest`` keep only their largest component.

    One label at a time, inside that label's own bounding box (all boxes found in one
    pass, with no mask of the whole map): component ids are uint32,
    so labelling a whole multi-organ box at once would cost four bytes per voxel of the
    whole foreground (over 300 MB on a 512 x 512 x 300 study); per organ the temporaries
    stay at the size of the largest organ's box. cc3d never joins voxels of different
    labels, so the result is the same as labelling all labels together.

    Args:
        labels: (slice, row, column) integer label map.
        spec: the model whose output this is.
        voxel_volume_ml: volume of one voxel (``Volume.voxel_volume_ml``).
        in_place: clean ``labels`` itself instead of a copy.
    """
    rules = spec.postprocess
    out = labels if in_place else labels.copy()
    if rules.min_component_ml <= 0 and not rules.keep_largest:
        return out
    min_voxels = rules.min_component_ml / voxel_volume_ml if voxel_volume_ml > 0 else 0.0
    largest_only = {spec.label(name).value for name in rules.keep_largest}
    removed = 0
    values = sorted({label.value for label in spec.labels})
    # Every label's box in one pass, before any edit: cleaning one label only zeroes
    # voxels of that label, so the boxes of the others stay exact.
    boxes = label_bboxes(out, max(values)) if values else []
    for value in values:
        box = boxes[value - 1] if value > 0 else None
        if box is None:
            continue
        region = out[box]  # a view: edits land in ``out``
        mask = region == value
        components, n = cc3d.connected_components(mask, connectivity=CONNECTIVITY, return_N=True)
        if n == 0:
            continue
        counts = np.bincount(components.ravel(), minlength=n + 1)
        keep = counts >= min_voxels
        if value in largest_only and n > 1:
            keep[:] = False
            keep[int(np.argmax(counts[1:])) + 1] = True
        keep[0] = True  # background of the mask: voxels of other labels, untouched
        if keep.all():
            continue
        drop = ~keep[components]
        region[drop] = 0
        removed += int(n + 1 - np.count_nonzero(keep))
    logger.debug("clean_labels: %d components removed", removed)
    return out
