"""OpenVINO's allocation failures are out-of-memory too: the batch is run again in
halves. Before 2026-12-07 only ONNX Runtime's and CUDA's texts were recognised, so on
OpenVINO (the default CPU provider) "Failed to allocate 5242880000 bytes of memory"
failed the study at once. A batch that does not fit even alone is a
:class:`DeviceMemoryError`: the device's state, which the scheduler can tell apart
from a fault of the model. The texts are OpenVINO 2025.4's (its CPU plugin's
cpu_memory.cpp, its core's allocator), as ONNX Runtime's OpenVINO provider wraps them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.factories.onnx_models import model_spec, threshold_logits, threshold_model

from radserve.errors import InferenceError
from radserve.inference import ModelSession, choose_runtime
from radserve.inference.session import DeviceMemoryError, is_out_of_memory

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)

OPENVINO_CPU = (
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running "
    "OpenVINO-EP-subgraph_1 node. ... [OpenVINO-EP] In Error Couldn't start Inference: "
    "Exception from src/inference/src/cpp/infer_request.cpp:224:\nException from "
    "src/plugins/intel_cpu/src/node.cpp:792:\n[CPU] Broadcast node with name "
    "'Broadcast_3505' Check 'ptr' failed at src/plugins/intel_cpu/src/cpu_memory.cpp:257:\n"
    "Failed to allocate 5242880000 bytes of memory\n"
)
OTHERS = [
    OPENVINO_CPU,
    "Exception from src/core/src/runtime/allocator.cpp: Failed to allocate memory",
    "Exception from src/core/src/runtime/tensor.cpp: Cannot allocate memory for type: f32",
    "[OpenVINO-EP] Exception: std::bad_alloc",
    "[GPU] clEnqueueNDRangeKernel, error code: -5 CL_OUT_OF_RESOURCES",
]
NOT_MEMORY = [
    "[CPU] Failed to allocate aux GPR",
    "Failed to allocate required number of vector registers",
    "Input and filter channels must match",
]


@pytest.mark.parametrize("text", OTHERS)
def test_openvino_allocation_failures_are_out_of_memory(text: str) -> None:
    assert is_out_of_memory(RuntimeError(text))


@pytest.mark.parametrize("text", NOT_MEMORY)
def test_other_failures_are_not(text: str) -> None:
    assert not is_out_of_memory(RuntimeError(text))


class _Fails:
    """A session's ``_run_once`` failing as OpenVINO does above ``fits`` samples."""

    def __init__(self, session: ModelSession, fits: int) -> None:
        self.real, self.fits, self.sizes = session._run_once, fits, []

    def __call__(self, x: np.ndarray, *, shrink: bool = False) -> np.ndarray:
        self.sizes.append(len(x))
        if len(x) > self.fits:
            raise RuntimeError(OPENVINO_CPU)
        return self.real(x, shrink=shrink)


def test_openvino_out_of_memory_halves_the_batch(tmp_path: Path, monkeypatch) -> None:
    session = ModelSession(
        threshold_model(tmp_path / "t.onnx"), model_spec(batch_size=8), runtime=CPU
    )
    fails = _Fails(session, fits=2)
    monkeypatch.setattr(session, "_run_once", fails)
    x = np.random.default_rng(0).random((8, 1, 6, 6), dtype=np.float32)
    np.testing.assert_allclose(session.run(x), threshold_logits(x), atol=1e-5)
    assert session.batch_limit == 2 and fails.sizes[:3] == [8, 4, 2]


def test_a_sample_that_does_not_fit_alone_is_a_device_memory_error(
    tmp_path: Path, monkeypatch
) -> None:
    session = ModelSession(threshold_model(tmp_path / "t.onnx"), model_spec(), runtime=CPU)
    monkeypatch.setattr(session, "_run_once", _Fails(session, fits=0))
    with pytest.raises(DeviceMemoryError, match="Failed to allocate 5242880000 bytes") as err:
        session.run(np.zeros((2, 1, 6, 6), np.float32))
    assert isinstance(err.value, InferenceError) and err.value.retryable
    # any other failure stays a plain inference error
    monkeypatch.setattr(session, "_run_once", _raise("Input and filter channels must match"))
    with pytest.raises(InferenceError) as other:
        session.run(np.zeros((1, 1, 6, 6), np.float32))
    assert not isinstance(other.value, DeviceMemoryError)


def _raise(text: str):  # type: ignore[no-untyped-def]
    def run(x: np.ndarray, *, shrink: bool = False) -> np.ndarray:
        raise RuntimeError(text)

    return run
