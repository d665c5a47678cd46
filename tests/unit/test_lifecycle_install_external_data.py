"""Install reads every tensor a graph stores for external data, not only the top graph's
initializers: a ``Constant`` node (or a subgraph's) whose data lies outside the bundle,
or whose declared bytes run past its file, is refused at install, naming it. Before,
such a bundle installed and was refused by ONNX Runtime only when it was deployed or
run. A graph saved with its weights beside it, as ``onnx.save_as_external_data`` writes
it, still installs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.factories.bundles import write_test_bundles
from tests.factories.host import CPU_HOST

from radserve.errors import BundleRejectedError
from radserve.lifecycle.install import install_bundle

HOST = CPU_HOST


def _external(tensor: TensorProto, location: str, length: int) -> TensorProto:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _weights() -> np.ndarray:
    w = np.zeros((2, 1, 1, 1), np.float32)
    w[1, 0] = 20.0
    return w


def _graph(nodes: list, initializers: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "h", "w"])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _constant_graph(location: str, length: int = 8) -> onnx.ModelProto:
    """The conv's weight from a Constant node whose tensor lies in ``location``."""
    value = _external(numpy_helper.from_array(_weights(), "wc"), location, length)
    return _graph(
        [
            helper.make_node("Constant", [], ["w"], value=value),
            helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1]),
        ],
        [numpy_helper.from_array(np.array([0.0, -1.0], np.float32), "b")],
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "organs-test" / "1.0.0"


@pytest.mark.parametrize("location", ["/etc/passwd", "../../outside.bin"])
def test_a_constant_reading_outside_the_bundle_is_refused(bundle, tmp_path, location):
    (tmp_path / "src" / "outside.bin").write_bytes(bytes(8))
    onnx.save(_constant_graph(location), str(bundle / "model.onnx"))
    with pytest.raises(BundleRejectedError, match="missing or outside") as refused:
        install_bundle(bundle, tmp_path / "data", host=HOST)
    assert repr(location) in str(refused.value)
    assert not (tmp_path / "data" / "models" / "organs-test").exists()


def test_a_subgraph_constant_reading_outside_the_bundle_is_refused(bundle, tmp_path):
    """The same Constant inside an ``If`` branch."""
    inner = _constant_graph("/etc/passwd").graph
    branch = helper.make_graph(
        list(inner.node),
        "branch",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=list(inner.initializer),
    )
    branch.node[1].input[0] = "w"
    model = _graph(
        [
            helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("c", 9, [], [1])),
            helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch),
        ],
        [],
    )
    onnx.save(model, str(bundle / "model.onnx"))
    with pytest.raises(BundleRejectedError, match="'/etc/passwd' missing or outside"):
        install_bundle(bundle, tmp_path / "data", host=HOST)


def test_external_data_declaring_more_bytes_than_its_file_holds_is_refused(bundle, tmp_path):
    (bundle / "w.bin").write_bytes(_weights().tobytes())
    weight = _external(numpy_helper.from_array(_weights(), "w"), "w.bin", 2 * 1024**3)
    bias = numpy_helper.from_array(np.array([0.0, -1.0], np.float32), "b")
    model = _graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1])], [weight, bias]
    )
    onnx.save(model, str(bundle / "model.onnx"))
    with pytest.raises(BundleRejectedError, match="bytes 0-2147483648 declared, the file holds 8"):
        install_bundle(bundle, tmp_path / "data", host=HOST)


def test_weights_saved_beside_the_graph_install(bundle, tmp_path):
    model = onnx.load(str(bundle / "model.onnx"))
    onnx.save(
        model,
        str(bundle / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    installed = install_bundle(bundle, tmp_path / "data", host=HOST)
    assert set(installed.files) == {"model.onnx", "model.onnx.data", "model.yaml"}
