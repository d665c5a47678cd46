"""A model whose output gives NaN class probabilities (NaN logits, or an infinite logit
under softmax) fails the study with a clear ``model_invalid`` error; before, a NaN
compared false with every probability, so its voxels went to background, and a model of
NaN weights labelled every study empty ("liver not found", no lesions) with no error.
Every place labels or classes are decided from probabilities is checked
(:func:`radserve.inference.tasks.refuse_nan`'s callers): slices (softmax and sigmoid,
``UpsampledDecision``), patches (softmax and sigmoid, ``decide``), nnU-Net's sigmoid
regions (``decide_regions``) and a classifier's score vectors (``ClassificationTask``,
softmax and sigmoid; untested before 2026-12-06). Finite logits label as before, and
infinite sigmoid logits, which are probabilities of 0 and 1, still serve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.factories.onnx_models import model_spec

from radserve.domain.volume import Volume
from radserve.errors import ModelError
from radserve.inference import (
    ClassificationTask,
    ModelSession,
    PatchTask,
    SliceTask,
    choose_runtime,
    run_task,
)
from radserve.models.manifest import ModelSpec

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
    ("offset", "activation"),
    [
        ((np.nan, np.nan), "softmax"),  # every logit: a NaN weight
        ((np.nan, 0.0), "softmax"),  # background's only: the class 1 square is there
        ((0.0, np.inf), "softmax"),  # softmax of an infinite logit is NaN
        ((np.nan, 0.0), "sigmoid"),  # one of two region channels
    ],
)
def test_a_slice_model_with_nan_probabilities_fails_the_study(tmp_path, offset, activation):
    labels = 2 if activation == "sigmoid" else 1
    spec = model_spec(batch_size=2, spacing=(None, 1.5, 1.5), labels=labels, activation=activation)
    path = _offset_model(tmp_path / "m.onnx", offset, spatial=2)
    session = ModelSession(path, spec, runtime=CPU)
    task = SliceTask(_volume(), spec, crop_to_body=False)
    with pytest.raises(ModelError, match=r"gives NaN class probabilities at [1-9]") as failed:
        run_task(task, session)
    assert failed.value.code == "model_invalid"
    assert failed.value.message.startswith(spec.key)


@pytest.mark.parametrize("kind", ["softmax", "sigmoid", "regions"])
def test_a_3d_model_with_nan_logits_fails_the_study(tmp_path, kind):
    """Softmax and sigmoid patches (``decide``), and sigmoid region channels (nnU-Net's
    region models, ``decide_regions``)."""
    if kind == "softmax":
        spec = model_spec(mode="3d", spacing=(2.0, 1.5, 1.5), patch_size=[4, 16, 16])
    elif kind == "sigmoid":
        spec = model_spec(
            mode="3d",
            spacing=(2.0, 1.5, 1.5),
            patch_size=[4, 16, 16],
            labels=2,
            activation="sigmoid",
        )
        assert not spec.channel_values
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


def _classifier_model(path: Path, offset: tuple[float, float]) -> Path:
    """A two-channel classifier: (N, 1, H, W) -> GlobalMaxPool -> 1x1 conv -> (N, 2)
    scores, class 1's score 20 (brightest pixel - 0.5), then ``offset`` added."""
    w = np.zeros((2, 1, 1, 1), np.float32)
    w[1, 0] = 20.0
    b = np.array([0.0, -10.0], np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalMaxPool", ["x"], ["pooled"]),
            helper.make_node("Conv", ["pooled", "w", "b"], ["c"], kernel_shape=[1, 1]),
            helper.make_node("Flatten", ["c"], ["flat"], axis=1),
            helper.make_node("Add", ["flat", "offset"], ["scores"]),
        ],
        "non_finite_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", "W"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.asarray([offset], np.float32), "offset"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _classifier_spec(activation: str) -> ModelSpec:
    labels = 2 if activation == "sigmoid" else 1  # two channels either way
    return ModelSpec.model_validate(
        {
            "name": "bleed",
            "version": "1.0.0",
            "task": "classification",
            "modality": "CT",
            "activation": activation,
            "input": {
                "mode": "2d",
                "spacing": [None, 1.5, 1.5],
                "crop": "none",
                "batch_size": 2,
                "normalisation": {"kind": "ct_window", "center": 500.0, "width": 1000.0},
            },
            "classification": {"aggregate": "max"},
            "labels": [
                {
                    "value": v,
                    "name": f"c{v}",
                    "kind": "class",
                    "concept": {"value": str(v), "meaning": f"c{v}"},
                    "category": {"value": "0", "meaning": "x"},
                }
                for v in range(1, labels + 1)
            ],
        }
    )


@pytest.mark.parametrize(
    ("offset", "activation"),
    [
        ((np.nan, np.nan), "softmax"),
        ((np.nan, 0.0), "softmax"),
        ((0.0, np.inf), "softmax"),
        ((np.nan, 0.0), "sigmoid"),
    ],
)
def test_a_classifier_with_nan_scores_fails_the_study(tmp_path, offset, activation):
    """Before, only the other decisions were tested: a NaN score reached the mean or
    maximum of the study's class probabilities unchecked by any test."""
    spec = _classifier_spec(activation)
    session = ModelSession(_classifier_model(tmp_path / "m.onnx", offset), spec, runtime=CPU)
    task = ClassificationTask(_volume(), spec, crop_to_body=False)
    with pytest.raises(ModelError, match=r"gives NaN class probabilities at [1-9]") as failed:
        run_task(task, session)
    assert failed.value.code == "model_invalid"


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_a_classifier_with_finite_scores_answers(tmp_path, activation):
    """The same graph with a finite offset: the bright square is seen on every slice."""
    spec = _classifier_spec(activation)
    session = ModelSession(_classifier_model(tmp_path / "m.onnx", (0.0, 0.0)), spec, runtime=CPU)
    prediction = run_task(ClassificationTask(_volume(), spec, crop_to_body=False), session)
    assert prediction.class_probabilities is not None
    assert prediction.class_probabilities[1] > 0.99 and prediction.slices == 6
