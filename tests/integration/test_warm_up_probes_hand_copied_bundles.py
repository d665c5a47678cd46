"""Warm-up runs its batch in the server's process, where nothing stops a graph that
loops. A bundle copied into ``models.dirs`` by hand was never probed by ``models
install`` (which runs its batch in a process of its own, killed after a time), so a
``Loop`` of 10^15 iterations there hung startup's warm-up and every deploy of it for
ever, before 2026-12-06. Such a bundle (or an installed one whose file changed since)
is now probed in a separate process first, and refused with the probe's reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.factories.service import settings_for

from radserve.domain.deployment import Role
from radserve.errors import DeploymentError, ModelError
from radserve.service import Service


def _write_looping_graph(path: Path, channels: int) -> None:
    """A 1x1 convolution to 2 classes, then a ``Loop`` of 10^15 identity iterations."""
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
    weights = {
        "w": np.full((2, channels, 1, 1), 1.0 / channels, np.float32),
        "b": np.zeros(2, np.float32),
        "trip": np.array(10**15, np.int64),
        "cond": np.array(True),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
            helper.make_node("Loop", ["trip", "cond", "c"], ["y"], body=body),
        ],
        "loops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "h", "w"])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture
def service(tmp_path: Path) -> Service:
    """A server whose ``models.dirs`` holds lesions-test 1.0.0 (2.5d, 3 channels) copied
    there by hand with a graph that loops; probes are given 10 s."""
    settings = settings_for(tmp_path)
    folder = tmp_path / "assets" / "models" / "lesions-test" / "1.0.0"
    _write_looping_graph(folder / "model.onnx", channels=3)
    server = Service(settings)
    server.catalog.probe_timeout_s = 10
    return server


def test_warming_a_hand_copied_looping_graph_ends_with_the_probe_s_reason(service):
    with pytest.raises(ModelError, match=r"not installed with `radserve models install`") as err:
        service.catalog.warm_model("lesions-test", "1.0.0")
    assert "did not answer a batch of shape (1, 3, 32, 32)" in err.value.message
    assert "within 10 s" in err.value.message


def test_startup_warm_up_records_the_looping_model_and_warms_the_others(service):
    state = service.catalog.warm_up()
    assert state.done
    assert list(state.failed) == ["lesions-test@1.0.0"]
    assert "did not answer a batch" in state.failed["lesions-test@1.0.0"]


def test_deploying_a_hand_copied_looping_graph_is_refused_not_hung(service):
    with pytest.raises(DeploymentError, match="does not load and run on this host") as err:
        service.lifecycle.deploy(
            "lesions-test", "1.0.0", role=Role.STABLE, actor="t", reason="trial"
        )
    assert "did not answer a batch" in err.value.message
