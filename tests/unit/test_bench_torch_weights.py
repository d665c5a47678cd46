"""The torch baselines run the bundles' ONNX graphs with torch alone (no onnx2torch):
radserve's own exported U-Net and the test bundles' convolutions give ONNX Runtime's
logits; a graph with an operator the interpreter does not know is refused by name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from tests.factories.bundles import write_test_bundles

from radserve.errors import ModelError
from radserve.models.registry import ModelRegistry

torch = pytest.importorskip("torch")

from radserve.bench.torch_weights import torch_model  # noqa: E402


def _bundle(path: Path, in_channels: int, name: str = "net") -> SimpleNamespace:
    return SimpleNamespace(
        onnx_path=lambda precision: path,
        spec=SimpleNamespace(name=name, input=SimpleNamespace(in_channels=in_channels)),
    )


def _agree(path: Path, module, x: np.ndarray) -> None:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert (got.argmax(1) == expected.argmax(1)).all()


def test_radserve_unet_runs_in_torch_as_in_onnx_runtime(tmp_path: Path) -> None:
    from radserve.training.export import export_onnx
    from radserve.training.net import UNet2d, UNetConfig

    torch.manual_seed(3)
    net = UNet2d(UNetConfig(in_channels=3, num_classes=5, channels=(4, 8, 16)))
    for module in net.modules():  # non-trivial BatchNorm statistics, folded at export
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    path = tmp_path / "unet.onnx"
    export_onnx(net.eval(), path, in_channels=3)
    module = torch_model(_bundle(path, 3))  # type: ignore[arg-type]
    x = np.random.default_rng(1).standard_normal((2, 3, 48, 40)).astype(np.float32)
    _agree(path, module, x)


def test_test_bundles_run_in_torch(tmp_path: Path) -> None:
    registry = ModelRegistry(write_test_bundles(tmp_path / "models"))
    for name in ("organs-test", "lesions-test"):
        bundle = registry.get(name, "1.0.0")
        module = torch_model(bundle)
        channels = bundle.spec.input.in_channels
        x = np.random.default_rng(2).uniform(0, 1, (1, channels, 32, 32)).astype(np.float32)
        _agree(bundle.onnx_path("fp32"), module, x)


def test_unknown_operator_is_refused_by_name(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Sin", ["x"], ["y"])],
        "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "H", "W"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "odd.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="Sin"):
        torch_model(_bundle(path, 1))  # type: ignore[arg-type]


def test_every_weight_follows_the_module_to_another_device() -> None:
    """The GPU baselines move the module with .to(device): a weight the forward pass read
    from anywhere but the module's buffers would stay behind on the CPU (as on the H200,
    2026-12-04: "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor)
    should be the same"). A round trip through float64 gives the module new buffers, as a
    move does; zeroing them must zero what the network computes."""
    from radserve.bench.torch_weights import torch_model
    from radserve.models.registry import ModelRegistry

    bundle = ModelRegistry().get("organs")
    module = torch_model(bundle).double().float()
    x = torch.ones((1, bundle.spec.input.in_channels, 64, 64))
    with torch.no_grad():
        assert torch.count_nonzero(module(x)) > 0
        for buffer in module.buffers():
            buffer.zero_()
        assert torch.count_nonzero(module(x)) == 0
