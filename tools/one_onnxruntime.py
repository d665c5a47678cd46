"""Leave at most one ONNX Runtime distribution in this environment, before installing.

``onnxruntime`` and ``onnxruntime-openvino`` install the same ``onnxruntime`` module;
with both present the files of the last one installed win and uninstalling either
breaks the other. radserve asks for the OpenVINO build on Linux x86-64 (pyproject.toml),
so an environment made before that holds the plain one: remove both here and the
install that follows puts back a whole ``onnxruntime-openvino``.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata


def installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def main() -> int:
    wants_openvino = sys.platform == "linux" and platform.machine() == "x86_64"
    unwanted = "onnxruntime" if wants_openvino else "onnxruntime-openvino"
    if not installed(unwanted):
        return 0
    names = ["onnxruntime", "onnxruntime-openvino"]
    print(f"removing {unwanted} (radserve installs {set(names) - {unwanted}} here)")
    return subprocess.call([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *names])


if __name__ == "__main__":
    raise SystemExit(main())
