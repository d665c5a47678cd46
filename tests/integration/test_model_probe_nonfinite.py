"""The probe batches install, import and a hand-copied bundle's warm-up run judge the
output's values and its size at more than one slice size, as every study will.

Before 2026-12-07 only the output's shape on one 32x32 slice was checked: a graph with
one NaN weight, or a +inf bias under softmax, installed, deployed, passed warm-up and
then failed every study ("NaN class probabilities at 1024 of 1024 values"); a graph
cropping its output to a fixed 32x32 installed (the probe was exactly 32 pixels) and
failed every wider study with a message naming no model and blaming model.yaml's
'activation' and 'labels'. The probe now applies the rule inference applies
(:func:`radserve.inference.tasks.nan_refusal`: NaN logits, or an infinite logit under
softmax; infinite sigmoid logits are certainties and still serve), on a second slice
wider by ``divisible_by`` (32x48), and a study's shape mismatch names the model and the
axes that differ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from tests.factories.bundles import write_classifier_bundle, write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.onnx_models import conv_model, model_spec
from tests.factories.service import settings_for

from radserve.domain.deployment import Role
from radserve.domain.volume import Volume
from radserve.errors import BundleRejectedError, DeploymentError, ModelError
from radserve.inference import ModelSession, SliceTask, choose_runtime, run_task
from radserve.inference.tasks import shape_mismatch
from radserve.lifecycle.install import install_bundle
from radserve.service import Service

HOST = CPU_HOST
CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)
NAN_SHARE = "its output gives NaN class probabilities at 1024 of 1024 values"


def _weights(channels: int, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """A threshold model's 1x1 conv: class 1 where the mean input is above 0.5."""
    w = np.zeros((classes, channels, 1, 1), np.float32)
    w[-1] = 20.0 / channels
    b = np.zeros(classes, np.float32)
    b[-1] = -10.0
    return w, b


def _cropping_model(path: Path, channels: int, edge: int = 32) -> Path:
    """The threshold conv, its output then sliced to ``edge`` x ``edge`` (the output
    declared with symbolic sizes, as an export that crops leaves it)."""
    w, b = _weights(channels)
    consts = {
        "w": w,
        "b": b,
        "starts": np.array([0, 0], np.int64),
        "ends": np.array([edge, edge], np.int64),
        "axes": np.array([2, 3], np.int64),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
            helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["y"]),
        ],
        "crops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "a", "b"])],
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "lesions-test" / "1.0.0"  # 2.5d: 3 channels in, 2 classes


def _refusal(folder: Path, tmp_path: Path) -> str:
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(folder, tmp_path / "data", host=HOST)
    assert not (tmp_path / "data" / "models" / folder.parent.name).exists()
    return refused.value.message


def test_a_nan_weight_is_refused_at_install_with_the_share_of_nan(bundle, tmp_path):
    w, b = _weights(3)
    w[1, 1] = np.nan  # the trial's hb/nan: one NaN weight, every logit of class 1 NaN
    conv_model(bundle / "model.onnx", w, b)
    message = _refusal(bundle, tmp_path)
    assert (
        "lesions-test/1.0.0 fp32 (model.onnx): on a batch of shape (1, 3, 32, 32) (zeros), "
        f"as the pipeline feeds it, {NAN_SHARE}"
    ) in message


def test_an_infinite_bias_is_refused_under_softmax_and_serves_under_sigmoid(bundle, tmp_path):
    w, b = _weights(3)
    b[1] = np.inf  # the trial's hb/inf: softmax of inf is inf - inf, NaN
    conv_model(bundle / "model.onnx", w, b)
    assert NAN_SHARE in _refusal(bundle, tmp_path)
    # sigmoid: one channel per label; +inf is a probability of 1, as inference decides it
    manifest = yaml.safe_load((bundle / "model.yaml").read_text())
    (bundle / "model.yaml").write_text(yaml.safe_dump({**manifest, "activation": "sigmoid"}))
    conv_model(bundle / "model.onnx", w[1:], b[1:])
    assert install_bundle(bundle, tmp_path / "data", host=HOST).version == "1.0.0"


def test_a_classifier_with_nan_scores_is_refused_at_install(tmp_path):
    folder = write_classifier_bundle(tmp_path / "src", "hemorrhage", 300.0)
    model = onnx.load(str(folder / "model.onnx"))
    for tensor in model.graph.initializer:
        if tensor.name == "b":
            values = numpy_helper.to_array(tensor).copy()
            values[0] = np.nan
            tensor.CopyFrom(numpy_helper.from_array(values, "b"))
    onnx.save(model, str(folder / "model.onnx"))
    message = _refusal(folder, tmp_path)
    assert "hemorrhage/1.0.0 fp32 (model.onnx): on a batch of shape (1, 1, 32, 32)" in message
    assert "its output gives NaN class probabilities at 2 of 2 values" in message


def test_a_hand_copied_nan_model_fails_warm_up_and_deploy(tmp_path):
    """Copied into models.dirs, never installed: warm-up's separate-process probe
    refuses it, naming the model, version and why, and so does a deploy."""
    settings = settings_for(tmp_path)
    folder = tmp_path / "assets" / "models" / "lesions-test" / "1.0.0"
    w, b = _weights(3)
    w[1, 1] = np.nan
    conv_model(folder / "model.onnx", w, b)
    service = Service(settings)
    with pytest.raises(ModelError) as err:
        service.catalog.warm_model("lesions-test", "1.0.0")
    assert err.value.message.startswith("lesions-test/1.0.0 fp32 (model.onnx)")
    assert NAN_SHARE in err.value.message
    with pytest.raises(DeploymentError) as refused:
        service.lifecycle.deploy("lesions-test", "1.0.0", role=Role.STABLE, actor="t", reason="t")
    assert NAN_SHARE in refused.value.message


def test_an_output_cropped_to_32_pixels_is_refused_at_install_naming_its_spatial_axes(
    bundle, tmp_path
):
    """The trial's hb/fixed32: right for a 32x32 probe, wrong for every wider slice."""
    _cropping_model(bundle / "model.onnx", 3)
    message = _refusal(bundle, tmp_path)
    assert (
        "lesions-test/1.0.0 fp32 (model.onnx): a batch of shape (1, 3, 32, 48) returned "
        "(1, 2, 32, 32), expected (1, 2, 32, 48)"
    ) in message
    assert "spatial size 32x32 for an input of 32x48: the graph fixes its spatial size" in message
    assert "'activation'" not in message


def test_a_study_s_shape_mismatch_names_the_model_and_the_axes_that_differ(tmp_path):
    """Such a graph served (installed before, or a models folder's): a slice of 48x48
    said "check model.yaml 'activation' and 'labels'", naming no model."""
    spec = model_spec(batch_size=2)
    session = ModelSession(_cropping_model(tmp_path / "m.onnx", 1), spec, runtime=CPU)
    hu = np.full((2, 40, 40), -1000, np.int16)  # 40 pixels of 1.5 mm: padded to 48
    hu[:, 10:30, 10:30] = 800
    task = SliceTask(Volume.from_geometry(hu, spacing=(2.0, 1.5, 1.5)), spec, crop_to_body=False)
    with pytest.raises(ModelError) as failed:
        run_task(task, session)
    message = failed.value.message
    assert message.startswith(
        "test-2d/1.0.0: model output has shape (2, 2, 32, 32), expected (2, 2, 48, 48): "
        "spatial size 32x32 for an input of 48x48: the graph fixes its spatial size"
    )
    assert "'activation'" not in message
    # a class count off the manifest keeps the activation/labels hint (a graph declaring
    # its class count is refused when its session loads, before any batch)
    hint = shape_mismatch((2, 3, 48, 48), (2, 2, 48, 48))
    assert hint.startswith("3 class channels, expected 2: check model.yaml 'activation'")
    assert "spatial" not in hint
