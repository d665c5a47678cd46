"""Volume -> network-ready arrays: resample, normalise, crop (see API.md)."""

from radserve.preprocess.context import (
    context_positions,
    context_reach,
    context_step,
    gather_context,
)
from radserve.preprocess.crop import (
    BBox,
    bbox_of_mask,
    bbox_of_values,
    body_bbox,
    crop_volume,
    expand_bbox,
    full_bbox,
    grid_offset,
    label_bboxes,
    roi_bbox,
)
from radserve.preprocess.normalise import normalise, normalised_floor
from radserve.preprocess.resample import (
    grid_coordinates,
    interpolate_axis,
    resample_inplane,
    resample_to_spacing,
    resampled_size,
)

__all__ = [
    "BBox",
    "bbox_of_mask",
    "bbox_of_values",
    "body_bbox",
    "context_positions",
    "context_reach",
    "context_step",
    "crop_volume",
    "expand_bbox",
    "full_bbox",
    "gather_context",
    "grid_coordinates",
    "grid_offset",
    "interpolate_axis",
    "label_bboxes",
    "normalise",
    "normalised_floor",
    "resample_inplane",
    "resample_to_spacing",
    "resampled_size",
    "roi_bbox",
]
