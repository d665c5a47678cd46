"""What this ONNX Runtime was built as and with: its package (onnxruntime,
onnxruntime-openvino, onnxruntime-gpu), the OpenVINO it carries, and the CUDA / cuDNN
versions a GPU build was compiled against. For ``radserve doctor``; cheap (no session).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import onnxruntime as ort

__all__ = ["RuntimeBuild", "openvino_version", "runtime_build"]

_OPENVINO_LIB = re.compile(r"^libopenvino\.so\.(\d+\.\d+\.\d+)$")


@dataclass(frozen=True)
class RuntimeBuild:
    package: str  # the wheel: onnxruntime, onnxruntime-openvino, onnxruntime-gpu, ...
    version: str
    providers: tuple[str, ...]
    openvino: str | None  # OpenVINO version, with where it was found
    cuda_built: str | None  # CUDA version a GPU build was compiled against
    cudnn_built: str | None


def openvino_version(capi_dir: Path | None = None) -> str | None:
    """The ``openvino`` package's version, else the OpenVINO runtime that
    onnxruntime-openvino ships inside itself (``libopenvino.so.<version>``)."""
    try:
        return f"{metadata.version('openvino')} (openvino package)"
    except metadata.PackageNotFoundError:
        pass
    folder = capi_dir or Path(ort.__file__).parent / "capi"
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return None
    for name in names:
        found = _OPENVINO_LIB.match(name)
        if found:
            return f"{found.group(1)} (bundled in onnxruntime's {folder.name}/)"
    return None


def runtime_build() -> RuntimeBuild:
    info: object = None
    with contextlib.suppress(ImportError):  # older wheels do not carry it
        from onnxruntime.capi import build_and_package_info as info  # type: ignore[no-redef]
    providers = tuple(ort.get_available_providers())
    return RuntimeBuild(
        package=str(getattr(info, "package_name", "onnxruntime")),
        version=ort.__version__,
        providers=providers,
        openvino=openvino_version() if "OpenVINOExecutionProvider" in providers else None,
        cuda_built=getattr(info, "cuda_version", None) or None,
        cudnn_built=getattr(info, "cudnn_version", None) or None,
    )
