"""The bundle's ONNX weights as a PyTorch module, for the baselines that run torch.

Both the naive baseline (PyTorch eager, as the issue defines it when torch is
installed) and the MONAI baseline run the very weights radserve serves. The ONNX graph
is run by :class:`OnnxGraphModule`, a small interpreter that calls ``torch.nn.functional``
for each node with the graph's own initializers as tensors: it needs only torch (no
onnx2torch, whose torchvision import fails beside a CPU-only torch build) and knows the
operators radserve's exported networks use (see :mod:`radserve.training.net`: Conv,
Relu, MaxPool, ConvTranspose, Concat) plus a few elementwise ones. A graph with any other
operator is refused with a :class:`~radserve.errors.ModelError` naming it, so a
baseline never runs a silently different network; :func:`torch_model` also checks the
module against ONNX Runtime on one input before it is used.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from radserve.errors import ModelError
from radserve.models.registry import ModelBundle

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

SUPPORTED_OPS = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "Relu",
        "MaxPool",
        "Concat",
        "Identity",
        "Cast",
        "Add",
        "Mul",
        "Sigmoid",
        "Softmax",
    }
)
# agreement with ONNX Runtime on the check input (float32, different kernels)
CHECK_ATOL = 1e-3


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _padding(attrs: dict[str, Any], spatial: int) -> list[int]:
    """Symmetric ONNX pads as torch's per-dimension padding (asymmetric ones refused)."""
    pads = list(attrs.get("pads", [0] * (2 * spatial)))
    begin, end = pads[:spatial], pads[spatial:]
    if begin != end or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise ModelError(f"asymmetric or automatic padding {pads} is not supported")
    return begin


def _module_class() -> type:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class OnnxGraphModule(nn.Module):
        """Runs one ONNX graph node by node with torch operations (eval only)."""

        def __init__(self, graph: Any) -> None:
            super().__init__()
            from onnx import numpy_helper

            unsupported = sorted({n.op_type for n in graph.node} - SUPPORTED_OPS)
            if unsupported:
                raise ModelError(
                    f"graph {graph.name!r} uses {', '.join(unsupported)}: the torch baseline "
                    f"runs only {', '.join(sorted(SUPPORTED_OPS))}"
                )
            # Weights are buffers, so that .to(device) moves them; integer constants
            # (shapes, axes) stay on the CPU.
            self.constants: dict[str, torch.Tensor] = {}
            self.buffer_of: dict[str, str] = {}
            for index, init in enumerate(graph.initializer):
                array = np.array(numpy_helper.to_array(init), copy=True)
                tensor = torch.from_numpy(array)
                if tensor.is_floating_point():
                    self.register_buffer(f"c{index}", tensor.float())
                    self.buffer_of[init.name] = f"c{index}"
                else:
                    self.constants[init.name] = tensor
            self.nodes = [(n.op_type, list(n.input), list(n.output), _attrs(n)) for n in graph.node]
            self.input_name = graph.input[0].name
            self.output_name = graph.output[0].name

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            values: dict[str, torch.Tensor] = {**self.constants, self.input_name: x.float()}
            values.update((name, getattr(self, b)) for name, b in self.buffer_of.items())
            for op, inputs, outputs, attrs in self.nodes:
                args = [values[name] if name else None for name in inputs]
                values[outputs[0]] = self._run(op, args, attrs)
            return values[self.output_name]

        @staticmethod
        def _run(op: str, args: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
            x = args[0]
            if op in ("Conv", "ConvTranspose"):
                weight, bias = args[1], args[2] if len(args) > 2 else None
                spatial = weight.dim() - 2
                kwargs = {
                    "stride": list(attrs.get("strides", [1] * spatial)),
                    "padding": _padding(attrs, spatial),
                    "dilation": list(attrs.get("dilations", [1] * spatial)),
                    "groups": int(attrs.get("group", 1)),
                }
                if op == "Conv":
                    function = (F.conv1d, F.conv2d, F.conv3d)[spatial - 1]
                    return function(x, weight, bias, **kwargs)
                if any(attrs.get("output_padding", [])) or "output_shape" in attrs:
                    raise ModelError("ConvTranspose output_padding/output_shape not supported")
                function = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[spatial - 1]
                return function(x, weight, bias, **kwargs)
            if op == "MaxPool":
                kernel = list(attrs["kernel_shape"])
                spatial = len(kernel)
                function = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[spatial - 1]
                return function(
                    x,
                    kernel,
                    stride=list(attrs.get("strides", kernel)),
                    padding=_padding(attrs, spatial),
                    dilation=list(attrs.get("dilations", [1] * spatial)),
                    ceil_mode=bool(attrs.get("ceil_mode", 0)),
                )
            if op == "Relu":
                return F.relu(x)
            if op == "Sigmoid":
                return torch.sigmoid(x)
            if op == "Softmax":
                return torch.softmax(x, dim=int(attrs.get("axis", -1)))
            if op == "Concat":
                return torch.cat(args, dim=int(attrs["axis"]))
            if op == "Add":
                return args[0] + args[1]
            if op == "Mul":
                return args[0] * args[1]
            return x.float() if op == "Cast" else x  # Cast (to float: checked), Identity

    return OnnxGraphModule


def _check_casts(graph: Any) -> None:
    from onnx import TensorProto

    for node in graph.node:
        if node.op_type == "Cast" and _attrs(node).get("to") != TensorProto.FLOAT:
            raise ModelError("the torch baseline supports Cast to float32 only")


def torch_model(bundle: ModelBundle) -> torch.nn.Module:
    """The bundle's FP32 ONNX graph as a torch module (same weights), in eval mode,
    checked against ONNX Runtime on one input."""
    import onnx

    proto = onnx.load(str(bundle.onnx_path("fp32")))
    _check_casts(proto.graph)
    model = _module_class()(proto.graph)
    model.eval()
    _check_against_onnxruntime(bundle, model)
    return model


def _check_against_onnxruntime(bundle: ModelBundle, model: torch.nn.Module) -> None:
    """One 64x64 input (3D models: 16x64x64) through both; a mismatch is a ModelError."""
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(
        str(bundle.onnx_path("fp32")), providers=["CPUExecutionProvider"]
    )
    declared = session.get_inputs()[0]
    rank = len(declared.shape)
    shape = [1, bundle.spec.input.in_channels] + ([16] if rank == 5 else []) + [64, 64]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if "float16" in declared.type:
        x = x.astype(np.float16)
    expected = session.run(None, {declared.name: x})[0]
    with torch.no_grad():
        got = model(torch.from_numpy(x)).numpy()
    if got.shape != expected.shape:
        raise ModelError(
            f"{bundle.spec.name}: torch gives {got.shape}, ONNX Runtime {expected.shape}"
        )
    if not np.allclose(got, expected, atol=CHECK_ATOL, rtol=1e-4):
        worst = float(np.max(np.abs(got - expected)))
        raise ModelError(f"{bundle.spec.name}: torch disagrees with ONNX Runtime by {worst:.2g}")
