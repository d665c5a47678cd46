"""A model is warmed up before anything routes to it (start, deploy, canary): the warm-up
batch's output must have the shape inference requires of every batch. Before session 35
only the batch size was checked, so a graph that strides its output down (declared as
the input's size, as a careless export does) was accepted as a 100 % canary, and every
study routed to it then failed with model_invalid."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.factories.onnx_models import conv_model
from tests.factories.service import settings_for

from radserve.domain.deployment import Role
from radserve.errors import DeploymentError, ModelError
from radserve.service import Service


def test_a_graph_whose_output_is_not_the_input_s_grid_fails_its_warm_up(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    folder = tmp_path / "assets" / "models" / "lesions-test" / "1.0.0"
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    channels = 2 * manifest["input"].get("context_slices", 0) + 1
    weight = np.zeros((2, channels, 1, 1), np.float32)
    weight[1, :, 0, 0] = 20.0 / channels
    bias = np.array([0.0, -10.0], np.float32)
    strided = tmp_path / "strided"
    strided.mkdir()
    conv_model(strided / "model.onnx", weight, bias, stride=2)
    (folder / "model.onnx").write_bytes((strided / "model.onnx").read_bytes())
    service = Service(settings)
    service.catalog.warm_model("organs-test", "1.0.0")  # a graph that keeps its grid
    with pytest.raises(ModelError, match=r"returned \(1, 2, 16, 16\), expected \(1, 2, 32, 32\)"):
        service.catalog.warm_model("lesions-test", "1.0.0")


def test_deploying_a_graph_this_host_cannot_load_is_a_409_not_an_outage(tmp_path: Path) -> None:
    """A bundle whose graph needs an opset ONNX Runtime lacks (install refuses it; this
    one is put in a model root by hand): its deploy answered 503 inference_failed,
    retryable, as if the server were down; it is the model's fault: 409
    deployment_invalid, not retryable."""
    import onnx

    settings = settings_for(tmp_path)
    models = tmp_path / "assets" / "models" / "lesions-test"
    older = models / "0.9.0"  # older than the stable 1.0.0, which keeps serving
    shutil.copytree(models / "1.0.0", older)
    manifest = yaml.safe_load((older / "model.yaml").read_text())
    (older / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": "0.9.0"}))
    graph = onnx.load(str(older / "model.onnx"))
    graph.opset_import[0].version = 99
    onnx.save(graph, str(older / "model.onnx"))
    service = Service(settings)
    with pytest.raises(DeploymentError) as refused:
        service.lifecycle.deploy(
            "lesions-test", "0.9.0", role=Role.CANARY, percent=10, actor="t", reason="trial"
        )
    assert "lesions-test 0.9.0 does not load and run on this host" in refused.value.message
    assert refused.value.code == "deployment_invalid" and not refused.value.retryable
