"""Tiny ONNX graphs (opset 17, dynamic batch and spatial axes) with known answers.

Each graph is a single convolution with fixed weights, so a test can compute the same
logits in numpy. ``model_spec`` builds a matching ``ModelSpec`` without a model.yaml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from radserve.models.manifest import ModelSpec

OPSET = 17


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def conv_model(
    path: Path,
    weight: np.ndarray,
    bias: np.ndarray,
    *,
    fp16_input: bool = False,
    fixed_batch: int | None = None,
    stride: int = 1,
) -> Path:
    """``y = conv(x, weight) + bias`` with 'same' zero padding; 2D or 3D from ``weight``.
    ``stride`` > 1: an output smaller than its input (declared as the input's size, as a
    careless export does)."""
    spatial = weight.ndim - 2
    in_ch, out_ch = weight.shape[1], weight.shape[0]
    pads = [k // 2 for k in weight.shape[2:]] * 2
    dims: list[Any] = [fixed_batch or "N", in_ch] + [f"s{i}" for i in range(spatial)]
    out_dims: list[Any] = [fixed_batch or "N", out_ch] + [f"s{i}" for i in range(spatial)]
    x_type = TensorProto.FLOAT16 if fp16_input else TensorProto.FLOAT
    nodes = []
    conv_in = "x"
    if fp16_input:
        nodes.append(helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT))
        conv_in = "x32"
    nodes.append(
        helper.make_node(
            "Conv",
            [conv_in, "w", "b"],
            ["logits"],
            kernel_shape=list(weight.shape[2:]),
            pads=pads,
            strides=[stride] * spatial,
        )
    )
    graph = helper.make_graph(
        nodes,
        "radserve_test",
        [helper.make_tensor_value_info("x", x_type, dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_dims)],
        initializer=[
            numpy_helper.from_array(weight.astype(np.float32), "w"),
            numpy_helper.from_array(bias.astype(np.float32), "b"),
        ],
    )
    return _save(graph, path)


def threshold_model(
    path: Path, *, in_channels: int = 1, scale: float = 20.0, level: float = 0.5, **kw: Any
) -> Path:
    """Two-class 1x1 conv: logit(class 1) - logit(class 0) = scale * (mean(x) - level)."""
    w = np.zeros((2, in_channels, 1, 1), np.float32)
    w[1, :, 0, 0] = scale / in_channels
    b = np.array([0.0, -scale * level], np.float32)
    return conv_model(path, w, b, **kw)


def threshold_logits(x: np.ndarray, *, scale: float = 20.0, level: float = 0.5) -> np.ndarray:
    """numpy twin of :func:`threshold_model` on (N, C, ...) input."""
    fg = scale * (x.mean(axis=1) - level)
    return np.stack([np.zeros_like(fg), fg], axis=1).astype(np.float32)


def blur3d_model(path: Path, *, scale: float = 20.0, level: float = 0.5) -> Path:
    """Two-class 3x3x3 mean filter: class 1 where the local mean exceeds ``level``."""
    w = np.zeros((2, 1, 3, 3, 3), np.float32)
    w[1, 0] = scale / 27.0
    b = np.array([0.0, -scale * level], np.float32)
    return conv_model(path, w, b)


def _label(value: int, name: str, kind: str = "organ") -> dict[str, Any]:
    concept = {"value": str(100 + value), "scheme": "SCT", "meaning": name}
    return {"value": value, "name": name, "concept": concept, "category": concept, "kind": kind}


def model_spec(
    *,
    mode: str = "2d",
    spacing: tuple[float | None, float, float] = (None, 1.5, 1.5),
    labels: int = 1,
    activation: str = "softmax",
    normalisation: dict[str, Any] | None = None,
    kind: str = "organ",
    **input_fields: Any,
) -> ModelSpec:
    """A valid ``ModelSpec`` for the test graphs (CT window 0..1000 HU by default).

    ``kind="lesion"`` labels make slice tasks keep a confidence map (organ ones don't).
    """
    return ModelSpec.model_validate(
        {
            "name": f"test-{mode}",
            "version": "1.0.0",
            "task": "segmentation",
            "modality": "CT",
            "activation": activation,
            "labels": [_label(v, f"label{v}", kind) for v in range(1, labels + 1)],
            "input": {
                "mode": mode,
                "spacing": spacing,
                "normalisation": normalisation
                or {"kind": "ct_window", "center": 500.0, "width": 1000.0},
                **input_fields,
            },
        }
    )


def max_classifier_model(
    path: Path, *, in_channels: int = 1, scale: float = 20.0, level: float = 0.5
) -> Path:
    """A classification graph: each sample's brightest pixel decides.

    (N, C, H, W) -> GlobalMaxPool -> 1x1 conv -> (N, 2) scores with
    logit(class 1) - logit(class 0) = scale * (mean over channels of each channel's
    maximum - level).
    """
    w = np.zeros((2, in_channels, 1, 1), np.float32)
    w[1, :, 0, 0] = scale / in_channels
    b = np.array([0.0, -scale * level], np.float32)
    nodes = [
        helper.make_node("GlobalMaxPool", ["x"], ["pooled"]),
        helper.make_node("Conv", ["pooled", "w", "b"], ["scores4"], kernel_shape=[1, 1]),
        helper.make_node("Flatten", ["scores4"], ["scores"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "radserve_test_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", in_channels, "H", "W"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return _save(graph, path)
