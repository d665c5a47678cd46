"""A graph of several outputs serves the one model.yaml's ``output`` names, and without
one is refused at install and at load. Before 2026-12-07 the first output was served
whatever the others were: a graph whose outputs were (negated logits, logits, score)
installed, labelled every study inside out and exited 0. A channels-last graph is
refused naming the layout (it read "a fixed spatial input ?x1")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper
from tests.factories.bundles import write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.onnx_models import conv_model, model_spec, threshold_logits

from radserve.errors import BundleRejectedError, ModelError
from radserve.importers.common import write_bundle_files
from radserve.inference import ModelSession, choose_runtime
from radserve.lifecycle.install import install_bundle
from radserve.models.manifest import ModelSpec, load_manifest

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _threshold(path: Path, in_channels: int) -> Path:
    """Two classes: logit(1) - logit(0) = 20 * (mean(x) - 0.5) (threshold_model's)."""
    w = np.zeros((2, in_channels, 1, 1), np.float32)
    w[1] = 20.0 / in_channels
    return conv_model(path, w, np.array([0.0, -10.0], np.float32))


def three_outputs(path: Path, in_channels: int = 1, *, first: str = "neg") -> Path:
    """The threshold graph answering (negated logits, logits, a score per sample), or
    with ``first="logits"`` the logits first."""
    model = onnx.load(str(_threshold(path, in_channels)))
    graph = model.graph
    graph.node.extend(
        [
            helper.make_node("Neg", ["logits"], ["neg"]),
            helper.make_node("ReduceMean", ["logits"], ["score"], keepdims=0, axes=[1, 2, 3]),
        ]
    )
    outputs = {
        "neg": helper.make_tensor_value_info("neg", TensorProto.FLOAT, ["N", 2, "s0", "s1"]),
        "logits": helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2, "s0", "s1"]),
        "score": helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N"]),
    }
    order = ["neg", "logits", "score"] if first == "neg" else ["logits", "neg", "score"]
    del graph.output[:]
    graph.output.extend(outputs[name] for name in order)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "lesions-test" / "1.0.0"  # 2.5d: 3 channels in, 2 classes


def _manifest(folder: Path, **fields: Any) -> None:
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest.update(fields)
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))


def _refusal(folder: Path, tmp_path: Path) -> str:
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(folder, tmp_path / "data", host=CPU_HOST)
    return refused.value.message


def test_several_outputs_are_refused_at_install_unless_one_is_named(bundle, tmp_path):
    three_outputs(bundle / "model.onnx", 3)
    message = _refusal(bundle, tmp_path)
    assert "the graph has 3 outputs ['neg', 'logits', 'score']" in message, message
    assert "`output: NAME`" in message

    _manifest(bundle, output="nope")
    assert "output 'nope' is not an output of the graph" in _refusal(bundle, tmp_path)

    _manifest(bundle, output="logits")
    installed = install_bundle(bundle, tmp_path / "data", host=CPU_HOST)
    assert installed.version == "1.0.0"
    assert load_manifest(tmp_path / "data" / "models" / "lesions-test" / "1.0.0" / "model.yaml")


def test_the_named_output_is_the_one_served(tmp_path):
    x = np.random.default_rng(0).random((2, 1, 6, 5), dtype=np.float32)
    path = three_outputs(tmp_path / "three.onnx")
    spec = model_spec().model_copy(update={"output": "logits"})
    session = ModelSession(path, spec, runtime=CPU)
    np.testing.assert_allclose(session.run(x), threshold_logits(x), atol=1e-5)

    # unnamed, loading refuses it too (a bundle placed in a models folder by hand)
    with pytest.raises(ModelError, match=r"has 3 outputs \['neg', 'logits', 'score'\]"):
        ModelSession(path, model_spec(), runtime=CPU)
    # a graph of one output serves it, named or not
    one = _threshold(tmp_path / "one.onnx", 1)
    np.testing.assert_allclose(
        ModelSession(one, model_spec(), runtime=CPU).run(x), threshold_logits(x), atol=1e-5
    )


def test_an_import_names_the_first_output_of_a_graph_of_several(tmp_path):
    """The importers export the network's output as ``logits``, first; a TorchScript
    network returning a tuple gives more outputs beside it."""
    write_test_bundles(tmp_path / "src")
    folder = tmp_path / "src" / "lesions-test" / "1.0.0"
    three_outputs(folder / "model.onnx", 3, first="logits")
    spec = load_manifest(folder / "model.yaml")
    assert spec.output is None
    write_bundle_files(folder, spec, "# test\n", {}, providers=["CPUExecutionProvider"])
    written = ModelSpec.model_validate(yaml.safe_load((folder / "model.yaml").read_text()))
    assert written.output == "logits"


def test_a_channels_last_graph_is_refused_naming_the_layout(bundle, tmp_path):
    """A TensorFlow-style (N, H, W, C) graph: before, "a fixed spatial input ?x3"."""
    model = onnx.load(str(_threshold(tmp_path / "nchw.onnx", 3)))
    graph = model.graph
    graph.node.insert(0, helper.make_node("Transpose", ["nhwc"], ["x"], perm=[0, 3, 1, 2]))
    graph.node[-1].output[0] = "nchw_out"
    graph.node.append(helper.make_node("Transpose", ["nchw_out"], ["logits"], perm=[0, 2, 3, 1]))
    del graph.input[:]
    graph.input.append(helper.make_tensor_value_info("nhwc", TensorProto.FLOAT, ["N", "h", "w", 3]))
    del graph.output[:]
    graph.output.append(
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "h", "w", 2])
    )
    onnx.save(model, str(bundle / "model.onnx"))
    message = _refusal(bundle, tmp_path)
    assert "input 'nhwc' is [N, h, w, 3]: channels last" in message
    assert "channels first (N, C, H, W)" in message
    assert "fixed spatial input" not in message
