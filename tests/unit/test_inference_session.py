"""Sessions check the ONNX graph against model.yaml; providers are chosen by preference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.factories.onnx_models import model_spec, threshold_logits, threshold_model

from radserve.errors import ModelError
from radserve.inference import DeviceInfo, ModelSession, choose_runtime

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _host(*providers: str) -> DeviceInfo:
    return DeviceInfo("1.0", providers, usable_cores=8, logical_cores=16, ort_device="GPU")


def test_wrong_channel_count_is_a_clear_model_error(tmp_path: Path) -> None:
    path = threshold_model(tmp_path / "two.onnx", in_channels=2)
    with pytest.raises(ModelError, match=r"takes 2 input channels but model.yaml declares 1"):
        ModelSession(path, model_spec(), runtime=CPU)


def test_wrong_class_count_and_rank_are_refused(tmp_path: Path) -> None:
    path = threshold_model(tmp_path / "t.onnx")
    with pytest.raises(ModelError, match=r"outputs 2 channels .* need 3"):
        ModelSession(path, model_spec(labels=2), runtime=CPU)
    with pytest.raises(ModelError, match="needs rank 5"):
        ModelSession(path, model_spec(mode="3d", patch_size=(4, 4, 4)), runtime=CPU)


def test_unreadable_model_is_a_model_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(ModelError, match=r"cannot load ONNX model bad\.onnx"):
        ModelSession(bad, model_spec(), runtime=CPU)


def test_fp16_and_fixed_batch_graphs_give_float32_outputs(tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((3, 1, 5, 7), dtype=np.float32)
    want = threshold_logits(x)
    fp16 = ModelSession(
        threshold_model(tmp_path / "h.onnx", fp16_input=True),
        model_spec(),
        runtime=CPU,
        precision="fp16",
    )
    out = fp16.run(x)
    assert out.dtype == np.float32 and fp16.describe()["input_dtype"] == "float16"
    np.testing.assert_allclose(out, want, atol=0.05)
    fixed = ModelSession(
        threshold_model(tmp_path / "f.onnx", fixed_batch=2), model_spec(), runtime=CPU
    )
    assert fixed.fixed_batch == 2
    np.testing.assert_allclose(fixed.run(x), want, atol=1e-5)


def test_release_memory_leaves_the_session_working(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random((3, 1, 5, 7), dtype=np.float32)
    for fp16, fixed in ((False, None), (True, None), (False, 2)):
        session = ModelSession(
            threshold_model(tmp_path / f"r{fp16}{fixed}.onnx", fp16_input=fp16, fixed_batch=fixed),
            model_spec(divisible_by=8),
            runtime=CPU,
            precision="fp16" if fp16 else "fp32",
        )
        assert session._smallest_input_shape() == (fixed or 1, 1, 8, 8)
        before = session.run(x)
        session.release_memory()
        np.testing.assert_array_equal(session.run(x), before)


def test_provider_preference_and_thread_counts() -> None:
    gpu = choose_runtime(
        _host("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    )
    assert gpu.providers[0] == "TensorrtExecutionProvider" and gpu.device == "cuda:0"
    assert gpu.providers[-1] == "CPUExecutionProvider" and gpu.intra_op_threads == 4
    assert "OpenVINOExecutionProvider" in gpu.reason
    cuda = choose_runtime(_host("CUDAExecutionProvider", "CPUExecutionProvider"), device_id=1)
    assert cuda.provider_options[0]["device_id"] == "1"
    assert cuda.provider_options[0]["cudnn_conv_algo_search"] == "HEURISTIC"
    cpu = choose_runtime(_host("AzureExecutionProvider", "CPUExecutionProvider"))
    assert cpu.providers == ("CPUExecutionProvider",) and cpu.intra_op_threads == 8
    assert cpu.as_report()["device"] == "cpu"


def test_asking_for_a_missing_provider_fails_loudly() -> None:
    with pytest.raises(ModelError, match="onnxruntime-gpu"):
        choose_runtime(_host("CPUExecutionProvider"), prefer=["CUDAExecutionProvider"])
    with pytest.raises(ModelError, match="unknown execution providers"):
        choose_runtime(_host("CPUExecutionProvider"), prefer=["CudaProvider"])
