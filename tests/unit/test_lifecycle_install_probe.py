"""Install and import run one batch through each graph, shaped as the pipeline feeds it,
and refuse an output off the input's grid (a segmentation output half the input's
height and width, or of another depth) or a fixed spatial input no study can match,
naming the expected and the actual shape. Before 2026-12-06 such a graph installed (it
was read, not run) and was refused only by its deploy's warm-up and by every study.
A classification model's (N, classes) output installs: before, install refused every
classifier as "rank 2; input.mode '2d' needs rank 4"."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from tests.factories.bundles import write_classifier_bundle, write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.onnx_models import conv_model

from radserve.errors import BundleRejectedError
from radserve.importers import ImportRefusedError
from radserve.importers.common import write_bundle_files
from radserve.lifecycle.graph_checks import check_onnx
from radserve.lifecycle.install import install_bundle
from radserve.models.manifest import load_manifest

HOST = CPU_HOST


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "lesions-test" / "1.0.0"  # 2.5d: 3 channels in, 2 classes


def _threshold_weights(in_ch: int, spatial: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.zeros((2, in_ch, *(1,) * spatial), np.float32)
    w[1] = 20.0 / in_ch
    return w, np.array([0.0, -10.0], np.float32)


def _as_3d(folder: Path, patch: list[int]) -> Path:
    """The bundle's model.yaml turned into a 3D model of one channel and ``patch``."""
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["input"] = {
        "mode": "3d",
        "spacing": [2.0, 1.5, 1.5],
        "patch_size": patch,
        "normalisation": manifest["input"]["normalisation"],
    }
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    return folder


def _graph(path: Path, nodes: list[Any], x_dims: list[Any], y_dims: list[Any], **init: Any) -> Path:
    graph = helper.make_graph(
        nodes,
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)],
        initializer=[numpy_helper.from_array(v, k) for k, v in init.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _refusal(folder: Path, tmp_path: Path) -> str:
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(folder, tmp_path / "data", host=HOST)
    assert not (tmp_path / "data" / "models" / folder.parent.name).exists()
    return refused.value.message


def test_a_2d_output_at_half_the_input_size_is_refused_at_install(bundle, tmp_path):
    w, b = _threshold_weights(3, 2)
    conv_model(bundle / "model.onnx", w, b, stride=2)  # declared as the input's size
    message = _refusal(bundle, tmp_path)
    assert (
        "lesions-test/1.0.0 fp32 (model.onnx): a batch of shape (1, 3, 32, 32) returned "
        "(1, 2, 16, 16), expected (1, 2, 32, 32)"
    ) in message


def test_a_3d_output_of_another_depth_is_refused_at_install(bundle, tmp_path):
    folder = _as_3d(bundle, [8, 16, 16])
    w, b = _threshold_weights(1, 3)
    conv = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1, 1], strides=[2, 1, 1]
    )
    dims = ["N", 1, "d", "h", "w"]
    _graph(folder / "model.onnx", [conv], dims, ["N", 2, "d", "h", "w"], w=w, b=b)
    message = _refusal(folder, tmp_path)
    assert "returned (1, 2, 4, 16, 16), expected (1, 2, 8, 16, 16)" in message


def test_a_3d_graph_declaring_another_patch_is_refused_without_running(bundle, tmp_path):
    folder = _as_3d(bundle, [8, 16, 16])
    w, b = _threshold_weights(1, 3)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1, 1])
    _graph(folder / "model.onnx", [conv], ["N", 1, 8, 32, 32], ["N", 2, 8, 32, 32], w=w, b=b)
    message = _refusal(folder, tmp_path)
    assert (
        "fixed spatial input 8x32x32; the pipeline feeds patches of input.patch_size (8, 16, 16)"
        in message
    )
    # the patch the graph was exported at installs
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["input"]["patch_size"] = [8, 32, 32]
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    assert install_bundle(folder, tmp_path / "data", host=HOST).version == "1.0.0"


def test_a_2d_graph_with_a_fixed_height_and_width_is_refused(bundle, tmp_path):
    """Dynamic batch, fixed 64x64: slices arrive at each study's crop size."""
    w, b = _threshold_weights(3, 2)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1])
    _graph(bundle / "model.onnx", [conv], ["N", 3, 64, 64], ["N", 2, 64, 64], w=w, b=b)
    message = _refusal(bundle, tmp_path)
    assert "declares a fixed spatial input 64x64; 2.5d slices reach the network" in message
    assert "export it with dynamic height and width" in message


def test_a_graph_that_does_not_run_is_refused_with_onnx_runtime_s_reason(bundle, tmp_path):
    """A Reshape to a size baked in at export: it loads, and fails on the probe batch."""
    w, b = _threshold_weights(3, 2)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["y"]),
    ]
    shape = np.array([1, 2, 512, 512], np.int64)
    _graph(
        bundle / "model.onnx", nodes, ["N", 3, "h", "w"], ["N", 2, "h", "w"], w=w, b=b, shape=shape
    )
    message = _refusal(bundle, tmp_path)
    assert "it does not run on a batch of shape (1, 3, 32, 32), as the pipeline feeds it" in message


def test_a_graph_this_onnx_runtime_does_not_load_is_refused_naming_the_operator(bundle, tmp_path):
    """An operator of a custom domain no provider here implements: before, read and
    installed, then refused by its deploy."""
    w, b = _threshold_weights(3, 2)
    nodes = [
        helper.make_node("SiteNorm", ["x"], ["n"], domain="org.example"),
        helper.make_node("Conv", ["n", "w", "b"], ["y"], kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "h", "w"])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("org.example", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(bundle / "model.onnx"))
    message = _refusal(bundle, tmp_path)
    assert "cannot load ONNX model model.onnx for lesions-test/1.0.0" in message
    assert "org.example:SiteNorm" in message and ".staging" not in message


def test_a_classifier_installs_and_one_of_another_class_count_is_refused(tmp_path):
    folder = write_classifier_bundle(tmp_path / "src", "hemorrhage", 300.0)
    assert install_bundle(folder, tmp_path / "data", host=HOST).name == "hemorrhage"
    other = tmp_path / "other" / "bleed" / "1.0.0"
    shutil.copytree(folder, other)
    manifest = yaml.safe_load((other / "model.yaml").read_text())
    manifest["name"] = "bleed"
    manifest["activation"] = "sigmoid"  # one channel per label: 1, the graph gives 2
    (other / "model.yaml").write_text(yaml.safe_dump(manifest))
    message = _refusal(other, tmp_path)
    assert "output 'scores' has 2 channels; the manifest implies 1 output classes" in message


def test_a_classifier_answering_per_pixel_is_refused(tmp_path):
    folder = write_classifier_bundle(tmp_path / "src", "hemorrhage", 300.0)
    w, b = _threshold_weights(1, 2)
    conv_model(folder / "model.onnx", w, b)  # (N, 2, H, W): a segmentation graph
    message = _refusal(folder, tmp_path)
    assert "a classification model's output needs rank 2 (N, classes)" in message


def test_the_importers_check_refuses_an_exported_network_off_the_patch_grid(bundle, tmp_path):
    """nnU-Net and MONAI imports write their bundle through write_bundle_files: an
    exported network whose output is half the patch (both torch and ONNX Runtime
    agree on it, so the export check passed) is refused there, nothing imported."""
    folder = _as_3d(bundle, [8, 16, 16])
    w, b = _threshold_weights(1, 3)
    conv = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1, 1], strides=[1, 2, 2]
    )
    _graph(folder / "model.onnx", [conv], ["batch", 1, 8, 16, 16], ["batch", 2, 8, 8, 8], w=w, b=b)
    spec = load_manifest(folder / "model.yaml")
    with pytest.raises(
        ImportRefusedError, match=r"declares the spatial size 8x8x8 for patches of \(8, 16, 16\)"
    ):
        write_bundle_files(folder, spec, "# test\n", {})
    # declared as the patch, as torch.onnx.export may: the probe batch finds it
    _graph(
        folder / "model.onnx",
        [conv],
        ["batch", 1, 8, 16, 16],
        ["batch", 2, "d", "h", "w"],
        w=w,
        b=b,
    )
    with pytest.raises(
        ImportRefusedError, match=r"returned \(1, 2, 8, 8, 8\), expected \(1, 2, 8, 16, 16\)"
    ):
        write_bundle_files(folder, spec, "# test\n", {})


@pytest.mark.parametrize("stored", ["embedded", "external"])
def test_a_weight_declaring_more_than_it_holds_is_refused_before_any_session(
    bundle, tmp_path, stored
):
    """ONNX Runtime allocates what a tensor declares when a session loads: a weight of
    16 bytes declared as 16 GiB took the process's memory (or was refused, bad_alloc)
    at deploy. Install now opens a session for its probe batch, so the sizes are
    counted first (here 64 MiB declared, so that the test itself stays small)."""
    w, b = _threshold_weights(3, 2)
    big = onnx.TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[1 << 12, 1 << 12])
    if stored == "embedded":
        big.raw_data = b"\0" * 16
    else:
        (bundle / "model.data").write_bytes(b"\0" * 16)
        big.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "model.data"), ("offset", "0"), ("length", "16")):
            big.external_data.add(key=key, value=value)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("ReduceMax", ["big"], ["m"], keepdims=0),
        helper.make_node("Add", ["c", "m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "h", "w"])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), big],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(bundle / "model.onnx"))
    message = _refusal(bundle, tmp_path)
    assert "tensor 'big' declares 4096x4096 FLOAT (67,108,864 bytes) and holds 16 bytes" in message


def test_a_patch_whose_batch_this_host_cannot_hold_is_refused_before_it_is_made(bundle, tmp_path):
    """A 2,048-voxel edge is a valid patch_size; one such batch of 20 classes (0.7 TiB)
    would take the server's memory at install, as every study's would at serving."""
    folder = _as_3d(bundle, [2048, 2048, 2048])
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    first = manifest["labels"][0]
    manifest["labels"] = [{**first, "value": v, "name": f"part_{v}"} for v in range(1, 21)]
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    w = np.zeros((21, 1, 1, 1, 1), np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1, 1])
    _graph(folder / "model.onnx", [conv], ["N", 1, "d", "h", "w"], ["N", 21, "d", "h", "w"], w=w)
    message = _refusal(folder, tmp_path)
    assert "one batch of shape (1, 1, 2048, 2048, 2048) and its output need 704.0 GiB" in message


@pytest.mark.parametrize(
    ("io_type", "refusal"),
    [
        (TensorProto.FLOAT16, None),  # fed float16, its output read as float32
        (TensorProto.INT64, "input 'x' is INT64, expected float"),
        (TensorProto.DOUBLE, "output 'y' is DOUBLE, expected float"),
    ],
)
def test_the_element_type_of_a_graph_s_input_and_output(bundle, tmp_path, io_type, refusal):
    w, b = _threshold_weights(3, 2)
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Conv", ["xf", "w", "b"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Cast", ["c"], ["y"], to=io_type),
    ]
    graph = helper.make_graph(
        nodes,
        "types",
        [helper.make_tensor_value_info("x", io_type, ["N", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", io_type, ["N", 2, "h", "w"])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(bundle / "model.onnx"))
    if refusal is None:
        assert install_bundle(bundle, tmp_path / "data", host=HOST).version == "1.0.0"
    else:
        assert refusal in _refusal(bundle, tmp_path)


def test_a_graph_that_loops_for_ever_is_refused_after_the_probe_s_time(bundle, tmp_path):
    """A Loop of 10^15 iterations: the probe ran in the installing process (as warm-up
    runs in the server's) and the install never answered; ONNX Runtime's terminate flag
    does not stop OpenVINO's compiled graph. The probe's own process is killed."""
    w, b = _threshold_weights(3, 2)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["acc_in"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None),
        ],
    )
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Loop", ["trip", "cond", "c"], ["y"], body=body),
    ]
    trip, cond = np.array(10**15, np.int64), np.array(True)
    _graph(
        bundle / "model.onnx",
        nodes,
        ["N", 3, "h", "w"],
        ["N", 2, "h", "w"],
        w=w,
        b=b,
        trip=trip,
        cond=cond,
    )
    reasons = check_onnx(load_manifest(bundle / "model.yaml"), bundle, probe_timeout_s=10)
    assert reasons == [
        "lesions-test/1.0.0 fp32 (model.onnx): it did not answer a batch of shape "
        "(1, 3, 32, 32), as the pipeline feeds it, within 10 s (session load included): a "
        "graph that loops or is far too slow for serving"
    ]
