"""A model's output mapped back onto the input volume's grid, voxel for voxel."""

from __future__ import annotations

from dataclasses import dataclass, field

from radserve.domain.volume import Volume


@dataclass(frozen=True, eq=False)
class Prediction:
    """Label map (uint8) and, optionally, the winning class's probability scaled to
    uint8 (0..255) for per-finding confidence.

    Both lie on the input's grid, or, for a model restricted to an ROI
    (``input.roi_labels``), on the ROI's sub-grid of it: each Volume carries its own
    affine, and the post-processing maps findings back to the input grid.
    """

    model: str
    model_version: str
    precision: str
    labels: Volume
    confidence: Volume | None = None
    timings: dict[str, float] = field(default_factory=dict)
    batches: int = 0
    # Every non-zero label lies inside this box of ``labels`` (None: not known), so
    # post-processing need not scan the rest of the grid.
    extent: tuple[slice, slice, slice] | None = None
    # A classification model's answer instead of a label map (``labels`` stays all
    # background): each output channel's probability aggregated over the slices read.
    class_probabilities: tuple[float, ...] | None = None
    slices: int = 0
    # what the task found wrong with the model's outputs without refusing them (an
    # output that looks like probabilities), for the step's report warnings
    warnings: tuple[str, ...] = ()
