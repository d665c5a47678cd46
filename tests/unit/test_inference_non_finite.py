"""A model whose output gives NaN class probabilities (NaN logits, or an infinite logit
under softmax) fails the study with a clear ``model_invalid`` error; before, a NaN
compared false with every probability, so its voxels went to background, and a model of
NaN weights labelled every study empty ("liver not found", no lesions) with no error.
Slice, patch and region (sigmoid) decisions are checked. Finite logits label as before,
and infinite sigmoid logits, which are probabilities of 0 and 1, still serve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.factories.onnx_models import model_spec

from radserve.domain.volume import Volume
from radserve.errors import ModelError
from radserve.inference import ModelSession, PatchTask, SliceTask, choose_runtime, run_task

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _offset_model(path: Path, offset: tuple[float, float], *, spatial: int) -> Path:
    """Two classes: class 1's logit is 20 (x - 0.5), then ``offset`` added per class."""
    kernel = (1,) * spatial
    w = np.zeros((2, 1, *kernel), np.float32)
    w[1, 0] = 20.0
    b = np.array([0.0, -10.0], np.float32)
    add = np.asarray(offset, np.float32).reshape(1, 2, *kernel)
    dims = ["N", 1, *(f"s{i}" for i in range(spatial))]
    out_dims = ["N", 2, *(f"s{i}" for i in range(spatial))]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=list(kernel)),
            helper.make_node("Add", ["c", "offset"], ["logits"]),
        ],
        "non_finite",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_dims)],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(add, "offset"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _volume() -> Volume:
    hu = np.full((6, 24, 24), -1000, np.int16)
    hu[:, 6:18, 6:18] = 800  # class 1 (above 500 HU) in the middle
    return Volume.from_geometry(hu, spacing=(2.0, 1.5, 1.5))


@pytest.mark.parametrize(
    "offset",
    [
        (np.nan, np.nan),  # every logit: a NaN weight
        (np.nan, 0.0),  # background's only: the class 1 square is there
        (0.0, np.inf),  # softmax of an infinite logit is NaN
    ],
)
def test_a_slice_model_with_nan_probabilities_fails_the_study(tmp_path, offset):
    spec = model_spec(batch_size=2, spacing=(None, 1.5, 1.5))
    path = _offset_model(tmp_path / "m.onnx", offset, spatial=2)
    session = ModelSession(path, spec, runtime=CPU)
    task = SliceTask(_volume(), spec, crop_to_body=False)
    with pytest.raises(ModelError, match=r"gives NaN class probabilities at [1-9]") as failed:
        run_task(task, session)
    assert failed.value.code == "model_invalid"
    assert failed.value.message.startswith(spec.key)


@pytest.mark.parametrize("labels", [1, 2])  # 2: sigmoid over two regions, 1: softmax
def test_a_3d_model_with_nan_logits_fails_the_study(tmp_path, labels):
    """Softmax patches, and sigmoid region channels (nnU-Net's region models)."""
    if labels == 1:
        spec = model_spec(mode="3d", spacing=(2.0, 1.5, 1.5), patch_size=[4, 16, 16])
    else:
        spec = model_spec(
            mode="3d",
            spacing=(2.0, 1.5, 1.5),
            patch_size=[4, 16, 16],
            labels=2,
            activation="sigmoid",
        ).model_copy(update={"channel_values": (1, 2)})
    path = _offset_model(tmp_path / "m.onnx", (np.nan, 0.0), spatial=3)
    session = ModelSession(path, spec, runtime=CPU)
    with pytest.raises(ModelError, match="NaN class probabilities"):
        run_task(PatchTask(_volume(), spec), session)


def test_finite_logits_label_as_before(tmp_path):
    """The same graph with a finite offset labels the bright square."""
    spec = model_spec(batch_size=2, spacing=(None, 1.5, 1.5))
    path = _offset_model(tmp_path / "m.onnx", (0.0, 0.0), spatial=2)
    session = ModelSession(path, spec, runtime=CPU)
    labels = run_task(SliceTask(_volume(), spec, crop_to_body=False), session).labels.array
    assert labels[:, 6:18, 6:18].all() and labels.sum() == 6 * 12 * 12


def test_infinite_sigmoid_logits_decide_as_certainties(tmp_path):
    """Under sigmoid an infinite logit is a probability of 0 or 1, not a NaN: such a
    model still serves (channel 0 never, channel 1, label 2, everywhere)."""
    spec = model_spec(batch_size=2, spacing=(None, 1.5, 1.5), labels=2, activation="sigmoid")
    path = _offset_model(tmp_path / "m.onnx", (-np.inf, np.inf), spatial=2)
    session = ModelSession(path, spec, runtime=CPU)
    labels = run_task(SliceTask(_volume(), spec, crop_to_body=False), session).labels.array
    assert (labels == 2).all()
