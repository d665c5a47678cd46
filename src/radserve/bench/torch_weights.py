"""The bundle's ONNX weights as a PyTorch module, for the baselines that run torch.

Both the naive baseline (PyTorch eager, as the issue defines it when torch is
installed) and the MONAI baseline run the very weights radserve serves, converted by
onnx2torch; torch stays out of radserve's runtime dependencies.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from typing import TYPE_CHECKING, Any

from radserve.models.registry import ModelBundle

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def torch_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "onnx2torch"))


def _import_onnx2torch() -> Any:
    """``onnx2torch.convert``, importable without a working torchvision.

    onnx2torch imports torchvision at import time, only for its NMS and RoIAlign
    converters. Where torch is a CPU-only build, PyPI's (CUDA-linked) torchvision fails
    to load; the U-Nets here use neither op, so a placeholder whose ops raise is enough.
    It is visible only while onnx2torch is imported; later imports of torchvision fail
    as before.
    """
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # ImportError, or RuntimeError from a mismatched build
        _drop_torchvision()
        logger.info("torchvision unusable (%s); onnx2torch runs without NMS/RoIAlign", exc)

        def _missing(*_: object, **__: object) -> None:
            raise NotImplementedError("torchvision is not available in this environment")

        ops = types.ModuleType("torchvision.ops")
        ops.nms = ops.roi_align = ops.box_convert = _missing  # type: ignore[attr-defined]
        package = types.ModuleType("torchvision")
        package.ops = ops  # type: ignore[attr-defined]
        sys.modules["torchvision"], sys.modules["torchvision.ops"] = package, ops
        try:
            from onnx2torch import convert
        finally:
            _drop_torchvision()
        return convert
    from onnx2torch import convert

    return convert


def _drop_torchvision() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def _inline_shared_initializers(model: Any) -> Any:
    """Replace ``Identity(initializer)`` nodes by a copy of the initializer.

    torch's exporter deduplicates equal weights (e.g. equal biases) into one initializer
    plus Identity nodes; onnx2torch's Conv converter wants its weights as initializers.
    """
    from onnx import numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.input[0] in inits:
            array = numpy_helper.to_array(inits[node.input[0]])
            graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    return model


def torch_model(bundle: ModelBundle) -> torch.nn.Module:
    """The bundle's FP32 ONNX graph as a torch module (same weights), in eval mode."""
    import onnx

    convert = _import_onnx2torch()
    proto = _inline_shared_initializers(onnx.load(str(bundle.onnx_path("fp32"))))
    model = convert(proto)
    model.eval()
    return model
