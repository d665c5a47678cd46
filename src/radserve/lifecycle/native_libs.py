"""Versions of the NVIDIA libraries this process would load (driver, CUDA runtime,
cuDNN, TensorRT), asked from the libraries themselves through ctypes: what is installed
can differ from what ONNX Runtime was built against, and that mismatch is the usual
reason a CUDA provider fails to start. Every probe returns ``None`` when the library is
absent or does not answer; nothing here needs a GPU to import."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "NvidiaStack",
    "cuda_version_text",
    "cudnn_version_text",
    "nvidia_stack",
    "tensorrt_version_text",
]


@dataclass(frozen=True)
class NvidiaStack:
    driver: str | None  # the CUDA version the driver supports (cuDriverGetVersion)
    runtime: str | None  # libcudart's cudaRuntimeGetVersion
    cudnn: str | None
    tensorrt: str | None


def cuda_version_text(value: int) -> str:
    """CUDA's ``1000 * major + 10 * minor`` (12040) -> ``12.4``."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def cudnn_version_text(value: int) -> str:
    """cuDNN 9+: ``10000 * major + 100 * minor + patch`` (90100 -> 9.1.0); cuDNN 8 and
    older: ``1000 * major + 100 * minor + patch`` (8902 -> 8.9.2)."""
    if value >= 90000:
        return f"{value // 10000}.{(value % 10000) // 100}.{value % 100}"
    return f"{value // 1000}.{(value % 1000) // 100}.{value % 100}"


def tensorrt_version_text(value: int) -> str:
    """TensorRT 10+: ``10000 * major + 100 * minor + patch`` (100300 -> 10.3.0); 8 and
    older: ``1000 * major + 100 * minor + patch`` (8601 -> 8.6.1)."""
    if value >= 100000:
        return f"{value // 10000}.{(value % 10000) // 100}.{value % 100}"
    return f"{value // 1000}.{(value % 1000) // 100}.{value % 100}"


def _load(names: Sequence[str]) -> ctypes.CDLL | None:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _int_out(names: Sequence[str], symbol: str) -> int | None:
    """``symbol(int*)`` returning 0 on success (the CUDA driver / runtime style)."""
    lib = _load(names)
    if lib is None or not hasattr(lib, symbol):
        return None
    value = ctypes.c_int(0)
    try:
        status = getattr(lib, symbol)(ctypes.byref(value))
    except OSError:
        return None
    return value.value if status == 0 and value.value > 0 else None


def _returned(names: Sequence[str], symbol: str, restype: type) -> int | None:
    lib = _load(names)
    if lib is None or not hasattr(lib, symbol):
        return None
    function = getattr(lib, symbol)
    function.restype = restype
    try:
        value = int(function())
    except OSError:
        return None
    return value if value > 0 else None


def nvidia_stack() -> NvidiaStack:
    """Ask each library for its version (None: not found)."""
    driver = _int_out(["libcuda.so.1", "libcuda.so"], "cuDriverGetVersion")
    runtime = _int_out(
        ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"],
        "cudaRuntimeGetVersion",
    )
    cudnn = _returned(["libcudnn.so", "libcudnn.so.9", "libcudnn.so.8"], "cudnnGetVersion",
                      ctypes.c_size_t)  # fmt: skip
    trt = _returned(["libnvinfer.so", "libnvinfer.so.10", "libnvinfer.so.8"],
                    "getInferLibVersion", ctypes.c_int)  # fmt: skip
    return NvidiaStack(
        driver=cuda_version_text(driver) if driver else None,
        runtime=cuda_version_text(runtime) if runtime else None,
        cudnn=cudnn_version_text(cudnn) if cudnn else None,
        tensorrt=tensorrt_version_text(trt) if trt else None,
    )
