"""Batches -> ONNX Runtime -> native-grid predictions (the only onnxruntime importer)."""

from typing import Any

import numpy as np

from radserve.domain.volume import Volume
from radserve.inference.classify import ClassificationTask
from radserve.inference.patches import PatchTask
from radserve.inference.providers import DeviceInfo, RuntimeChoice, choose_runtime, probe_host
from radserve.inference.runner import run_task, run_task_overlapped
from radserve.inference.session import ModelSession, SessionRef
from radserve.inference.slices import ArrivingSlices, SliceTask
from radserve.inference.tasks import Batch, InferenceCancelledError, Task
from radserve.models.manifest import ModelSpec
from radserve.preprocess.crop import BBox

__all__ = [
    "ArrivingSlices",
    "Batch",
    "ClassificationTask",
    "DeviceInfo",
    "InferenceCancelledError",
    "ModelSession",
    "PatchTask",
    "RuntimeChoice",
    "SessionRef",
    "SliceTask",
    "Task",
    "choose_runtime",
    "make_task",
    "probe_host",
    "run_task",
    "run_task_overlapped",
]


def make_task(
    volume: Volume,
    spec: ModelSpec,
    roi: BBox | None = None,
    extra_channels: dict[str, np.ndarray] | None = None,
    **kwargs: Any,
) -> SliceTask | PatchTask:
    """SliceTask for 2d/2.5d models, PatchTask for 3d, ClassificationTask for a
    classification model (same keyword arguments)."""
    cls: type[SliceTask | PatchTask]
    if spec.is_classifier:
        cls = ClassificationTask
    else:
        cls = PatchTask if spec.input.mode == "3d" else SliceTask
    return cls(volume, spec, roi, extra_channels, **kwargs)
