"""A graph that applies its activation itself (ends in Sigmoid or Softmax) is refused at
install unless model.yaml says ``activation_in_graph: true``, which then serves its
probabilities as they are. Before 2026-12-07 it installed: a sigmoid model's
probabilities went through sigmoid again (at least 0.5 everywhere: the whole volume
labelled), and only the log said "looks like probabilities". What slips through is a
warning a task keeps for the report, not only a log line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import helper
from tests.factories.bundles import write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.onnx_models import conv_model, model_spec

from radserve.domain.volume import Volume
from radserve.errors import BundleRejectedError
from radserve.inference import ModelSession, choose_runtime, make_task
from radserve.inference.tasks import activate, decide
from radserve.lifecycle.install import install_bundle

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _with_activation(path: Path, classes: int, op: str, *, after: str = "") -> Path:
    """A 1x1 conv of ``classes`` logits (class c: 20 * (x - 0.5) * (c + 1) for sigmoid,
    class 1 over class 0 for softmax), then ``op`` (Sigmoid/Softmax), then ``after``
    (a value-keeping op such as Identity, or a Mul that hides the activation)."""
    w = np.zeros((classes, 1, 1, 1), np.float32)
    b = np.zeros(classes, np.float32)
    for c in range(classes):
        if classes == 1 or c > 0:
            w[c, 0] = 20.0 * (c + 1 if classes == 1 else 1)
            b[c] = -10.0 * (c + 1 if classes == 1 else 1)
    model = onnx.load(str(conv_model(path, w, b)))
    graph = model.graph
    graph.node[-1].output[0] = "raw"
    attrs: dict[str, Any] = {"axis": 1} if op == "Softmax" else {}
    last = "probs" if after else "logits"
    graph.node.append(helper.make_node(op, ["raw"], [last], **attrs))
    if after == "Identity":
        graph.node.append(helper.make_node("Identity", ["probs"], ["logits"]))
    elif after == "Mul":
        graph.initializer.append(onnx.numpy_helper.from_array(np.float32(1.0), "one"))
        graph.node.append(helper.make_node("Mul", ["probs", "one"], ["logits"]))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def organs(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "organs-test" / "1.0.0"  # 2d, 1 channel in, liver = 1


def _manifest(folder: Path, **fields: Any) -> None:
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest.update(fields)
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))


def _refusal(folder: Path, tmp_path: Path) -> str:
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(folder, tmp_path / "data", host=CPU_HOST)
    return refused.value.message


def test_a_sigmoid_graph_is_refused_unless_declared_and_then_labels_right(organs, tmp_path):
    _manifest(organs, activation="sigmoid")
    path = _with_activation(organs / "model.onnx", 1, "Sigmoid", after="Identity")
    message = _refusal(organs, tmp_path)
    assert "its output 'logits' comes from a Sigmoid node (through Identity)" in message
    assert "sigmoid of a probability is at least 0.5" in message
    assert "Set `activation_in_graph: true` in model.yaml" in message

    _manifest(organs, activation_in_graph=True)
    assert install_bundle(organs, tmp_path / "data", host=CPU_HOST).version == "1.0.0"

    # served: probabilities back as logits, so the task's sigmoid gives them again and
    # only the voxels above the level are labelled (before: all of them)
    spec = model_spec(activation="sigmoid").model_copy(update={"activation_in_graph": True})
    x = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(1, 1, 8, 8)
    out = ModelSession(path, spec, runtime=CPU).run(x)
    want = 1.0 / (1.0 + np.exp(-(20.0 * x - 10.0)))
    np.testing.assert_allclose(activate(out, "sigmoid"), want, atol=1e-5)
    labels, _ = decide(activate(out, "sigmoid")[0], spec)
    np.testing.assert_array_equal(labels, (x[0, 0] > 0.5).astype(np.uint8))


def test_a_softmax_graph_is_refused_unless_declared(organs, tmp_path):
    path = _with_activation(organs / "model.onnx", 2, "Softmax")
    message = _refusal(organs, tmp_path)
    assert "comes from a Softmax node" in message and "squashes its probability" in message

    _manifest(organs, activation_in_graph=True)
    assert install_bundle(organs, tmp_path / "data", host=CPU_HOST).version == "1.0.0"
    spec = model_spec().model_copy(update={"activation_in_graph": True})
    x = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(1, 1, 8, 8)
    out = ModelSession(path, spec, runtime=CPU).run(x)
    fg = 20.0 * x[:, 0] - 10.0
    want = np.stack([1.0 / (1.0 + np.exp(fg)), 1.0 / (1.0 + np.exp(-fg))], axis=1)
    np.testing.assert_allclose(activate(out, "softmax"), want, atol=1e-5)


def test_activation_in_graph_on_a_graph_of_logits_is_refused(organs, tmp_path):
    """The declaration is checked against what the graph gives: logits read as
    probabilities would be clipped into nonsense."""
    _manifest(organs, activation_in_graph=True)
    message = _refusal(organs, tmp_path)  # the plain threshold graph: logits
    assert "declares activation_in_graph: true" in message and "logits" in message


def test_probabilities_that_slip_through_are_a_task_warning():
    """A Sigmoid hidden behind other arithmetic (here a Mul) is not refused at install:
    the first batch's output, all in [0, 1], gives the step a warning."""
    spec = model_spec(activation="sigmoid", crop="none")
    volume = Volume.from_geometry(np.zeros((3, 8, 8), np.int16), spacing=(2.0, 1.5, 1.5))
    task = make_task(volume, spec)
    while (batch := task.next_batch()) is not None:
        shape = (len(batch.items), spec.num_classes, *batch.inputs.shape[2:])
        task.accept(batch, np.full(shape, 0.3, np.float32))
    assert len(task.warnings) == 1
    assert "looks like probabilities" in task.warnings[0]
    assert "activation_in_graph: true" in task.warnings[0]
    assert task.finish().warnings == task.warnings  # the step's report warnings read it
    # logits give none
    task = make_task(volume, spec)
    while (batch := task.next_batch()) is not None:
        shape = (len(batch.items), spec.num_classes, *batch.inputs.shape[2:])
        task.accept(batch, np.full(shape, -4.0, np.float32))
    assert task.warnings == ()


def test_a_hidden_activation_installs(organs, tmp_path):
    """Only a Sigmoid/Softmax reached through value-keeping ops is the strong evidence
    install refuses on; behind a Mul it is left to the run-time warning."""
    _manifest(organs, activation="sigmoid")
    _with_activation(organs / "model.onnx", 1, "Sigmoid", after="Mul")
    assert install_bundle(organs, tmp_path / "data", host=CPU_HOST).version == "1.0.0"
