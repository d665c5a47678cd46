"""The probe batch that install (and warm-up, for a bundle never installed) runs in a
process of its own runs on the execution providers the server serves with
(``runtime.providers``), not on the host's default choice. Before 2026-12-07 it took
the default (OpenVINO on this build) whatever the server was set to: a graph that
OpenVINO cannot compile and the CPU provider runs was refused at install on a server
that serves on the CPU provider, and a graph failing only on the configured provider
would have passed install and failed at warm-up."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from tests.factories.bundles import write_test_bundles
from tests.factories.service import settings_for

from radserve.errors import BundleRejectedError, ModelError
from radserve.inference.probe import isolated_probe_refusal
from radserve.inference.providers import choose_runtime
from radserve.lifecycle.install import install_bundle
from radserve.lifecycle.requirements import HostFacts
from radserve.models.manifest import load_manifest
from radserve.service import Service

OPENVINO = "OpenVINOExecutionProvider" in ort.get_available_providers()
# what OpenVINO's CPU plugin says of the graph below (onnxruntime-openvino 1.24)
OPENVINO_REFUSES = "If operation with dynamic rank"
HOST = HostFacts(
    ort_version=ort.__version__,
    providers=tuple(ort.get_available_providers()),
    runs_bf16=False,
    free_memory_mb=4096,
)


def _write_if_graph(path: Path, channels: int) -> None:
    """A 1x1 convolution to 2 classes passed through an ``If`` whose branches differ in
    rank (always the first one: the input's maximum is never NaN). ONNX Runtime's CPU
    provider runs it; OpenVINO's CPU plugin refuses to compile it."""
    c_out = helper.make_tensor_value_info("c_out", TensorProto.FLOAT, None)
    then = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"])], "then", [], [c_out])
    other = helper.make_graph(
        [helper.make_node("ReduceMax", ["c"], ["c_out"], keepdims=0)], "else", [], [c_out]
    )
    weights = {
        "w": np.full((2, channels, 1, 1), 1.0 / channels, np.float32),
        "b": np.zeros(2, np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
            helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
            helper.make_node("IsNaN", ["m"], ["nan"]),
            helper.make_node("Not", ["nan"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
        ],
        "ranks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "h", "w"])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _bundle(root: Path, version: str = "1.0.1") -> Path:
    """lesions-test (2.5d, 3 channels, 2 classes) as ``version``, with the If graph."""
    write_test_bundles(root / "src")
    folder = root / "src" / "lesions-test" / version
    if version != "1.0.0":
        shutil.move(root / "src" / "lesions-test" / "1.0.0", folder)
        manifest = yaml.safe_load((folder / "model.yaml").read_text())
        (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": version}))
    _write_if_graph(folder / "model.onnx", channels=3)
    return folder


def test_a_graph_the_configured_cpu_provider_runs_installs_and_serves(tmp_path):
    """``runtime.providers: [CPUExecutionProvider]``: install's probe (and warm-up's, of
    a bundle copied by hand) ran on OpenVINO, the host's default, and refused the graph
    with OpenVINO's reason; this server never serves on OpenVINO."""
    server = Service(settings_for(tmp_path, runtime__providers=["CPUExecutionProvider"]))
    assert server.catalog.sessions.runtime.providers == ("CPUExecutionProvider",)
    installed = server.lifecycle.install(_bundle(tmp_path), actor="test")
    assert installed.version == "1.0.1"
    server.catalog.warm_model("lesions-test", "1.0.1")  # serves on the CPU provider
    # copied into models.dirs by hand: warm-up's own probe, on the same providers
    _write_if_graph(tmp_path / "assets" / "models" / "lesions-test" / "1.0.0" / "model.onnx", 3)
    server.catalog.warm_model("lesions-test", "1.0.0")


@pytest.mark.skipif(not OPENVINO, reason="needs onnxruntime-openvino")
def test_on_openvino_install_refuses_the_graph_with_the_reason_warm_up_gives(tmp_path):
    """The host's choice (OpenVINO): install refuses it, and the same graph copied into
    ``models.dirs`` by hand is refused at warm-up with the same reason."""
    server = Service(settings_for(tmp_path))
    assert server.catalog.sessions.runtime.primary == "OpenVINOExecutionProvider"
    with pytest.raises(BundleRejectedError, match=OPENVINO_REFUSES):
        server.lifecycle.install(_bundle(tmp_path / "a"), actor="test")
    _write_if_graph(tmp_path / "assets" / "models" / "lesions-test" / "1.0.0" / "model.onnx", 3)
    with pytest.raises(ModelError, match=OPENVINO_REFUSES):
        server.catalog.warm_model("lesions-test", "1.0.0")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="a CUDA host")
def test_a_provider_list_this_host_cannot_run_is_refused_at_install_as_at_serve(tmp_path):
    """A server set to ``[CUDAExecutionProvider]`` on this host refuses to start with
    choose_runtime's message; the probe gives the same message, rather than passing the
    bundle on the host's default providers."""
    with pytest.raises(ModelError) as at_serve:
        choose_runtime(prefer=["CUDAExecutionProvider"])
    folder = _bundle(tmp_path, "1.0.0")
    spec = load_manifest(folder / "model.yaml")
    refusal = isolated_probe_refusal(
        spec, folder / "model.onnx", providers=("CUDAExecutionProvider",)
    )
    assert refusal == at_serve.value.message
    with pytest.raises(BundleRejectedError) as at_install:
        install_bundle(folder, tmp_path / "data", host=HOST, providers=("CUDAExecutionProvider",))
    assert (
        f"lesions-test/1.0.0 fp32 (model.onnx): {at_serve.value.message}"
        in at_install.value.message
    )
