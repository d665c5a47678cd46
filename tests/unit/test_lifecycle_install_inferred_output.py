"""Install reads a graph's output as ONNX Runtime will: where the graph declares no
output shape, or a symbolic class axis (``["N", "c", "h", "w"]``, a careless export's
dynamic axes), the shape ONNX's inference gives is checked. Before, a graph with no
output shape was refused as "rank 0" although it serves (ONNX Runtime infers its
rank), and one whose symbolic class axis hid 3 classes beside 2 declared installed, to
be refused by every deploy and run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.factories.bundles import write_test_bundles
from tests.factories.onnx_models import model_spec

from radserve.domain.volume import Volume
from radserve.errors import BundleRejectedError
from radserve.inference import ModelSession, SliceTask, choose_runtime, run_task
from radserve.lifecycle.install import install_bundle
from radserve.lifecycle.requirements import HostFacts

HOST = HostFacts(
    ort_version="1.24.1",
    providers=("CPUExecutionProvider",),
    runs_bf16=False,
    free_memory_mb=4096,
)


def _model(path: Path, *, classes: int, output_dims: list | None) -> Path:
    """A 1x1 conv of ``classes`` outputs (class 1: above 0.5 of the CT window), its
    output declared with ``output_dims`` (None: no shape at all)."""
    w = np.zeros((classes, 1, 1, 1), np.float32)
    w[1, 0] = 20.0
    b = np.zeros(classes, np.float32)
    b[1] = -10.0
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, output_dims)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1])],
        "inferred",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "h", "w"])],
        [output],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "organs-test" / "1.0.0"  # one label: 2 classes


def test_a_graph_without_an_output_shape_installs_and_serves(bundle, tmp_path):
    _model(bundle / "model.onnx", classes=2, output_dims=None)
    installed = install_bundle(bundle, tmp_path / "data", host=HOST)
    spec = model_spec(spacing=(None, 1.5, 1.5))
    session = ModelSession(
        installed.directory / "model.onnx",
        spec,
        runtime=choose_runtime(prefer=["CPUExecutionProvider"], threads=1),
    )
    hu = np.full((3, 16, 16), -1000, np.int16)
    hu[:, 4:12, 4:12] = 800
    volume = Volume.from_geometry(hu, spacing=(2.0, 1.5, 1.5))
    labels = run_task(SliceTask(volume, spec, crop_to_body=False), session).labels.array
    assert labels.sum() == 3 * 8 * 8 and labels[:, 4:12, 4:12].all()


def test_a_symbolic_class_axis_hiding_another_class_count_is_refused(bundle, tmp_path):
    _model(bundle / "model.onnx", classes=3, output_dims=["N", "c", "h", "w"])
    with pytest.raises(BundleRejectedError, match="has 3 channels; the manifest implies 2"):
        install_bundle(bundle, tmp_path / "data", host=HOST)
    assert not (tmp_path / "data" / "models" / "organs-test").exists()
