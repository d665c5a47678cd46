"""``radserve doctor``'s runtime lines: NVIDIA library version encodings, the OpenVINO
version onnxruntime-openvino carries, and the CUDA line with and without a CUDA
provider (this host has none: the GPU branch runs on a described build)."""

from __future__ import annotations

from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest

from radserve.inference.build_info import RuntimeBuild, openvino_version, runtime_build
from radserve.lifecycle import doctor
from radserve.lifecycle.native_libs import (
    NvidiaStack,
    cuda_version_text,
    cudnn_version_text,
    tensorrt_version_text,
)
from radserve.lifecycle.requirements import host_facts


@pytest.mark.parametrize(
    ("encode", "value", "text"),
    [
        (cuda_version_text, 12040, "12.4"),
        (cuda_version_text, 11080, "11.8"),
        (cuda_version_text, 13000, "13.0"),
        (cudnn_version_text, 90100, "9.1.0"),
        (cudnn_version_text, 91002, "9.10.2"),
        (cudnn_version_text, 8902, "8.9.2"),
        (tensorrt_version_text, 100300, "10.3.0"),
        (tensorrt_version_text, 8601, "8.6.1"),
    ],
)
def test_nvidia_version_numbers_are_decoded(encode, value: int, text: str) -> None:
    assert encode(value) == text


def test_openvino_version_from_the_library_onnxruntime_carries(tmp_path: Path) -> None:
    try:
        metadata.version("openvino")
        pytest.skip("the openvino package is installed: its version wins")
    except metadata.PackageNotFoundError:
        pass
    for name in ("libopenvino.so", "libopenvino.so.2541", "libopenvino.so.2025.4.1"):
        (tmp_path / name).touch()
    assert openvino_version(tmp_path) == f"2025.4.1 (bundled in onnxruntime's {tmp_path.name}/)"
    assert openvino_version(tmp_path / "missing") is None


def checks_for(build: RuntimeBuild, stack: NvidiaStack, monkeypatch) -> dict[str, doctor.Check]:
    monkeypatch.setattr("radserve.inference.build_info.runtime_build", lambda: build)
    monkeypatch.setattr("radserve.lifecycle.native_libs.nvidia_stack", lambda: stack)
    return {c.name: c for c in doctor._runtime(host_facts())}


def test_this_host_reports_its_build_and_no_cuda_provider() -> None:
    checks = {c.name: c for c in doctor._runtime(host_facts())}
    build = runtime_build()
    assert checks["onnxruntime"].detail.startswith(f"{build.package} {build.version}")
    assert "CUDAExecutionProvider" not in build.providers  # no GPU on this machine
    assert checks["cuda"].status == "ok"
    assert checks["cuda"].detail.startswith("no CUDA provider: CPU serving")
    if "OpenVINOExecutionProvider" in build.providers:
        assert checks["openvino"].detail[0].isdigit(), checks["openvino"]


def test_a_cuda_build_reports_built_and_installed_versions_and_what_is_missing(
    monkeypatch,
) -> None:
    build = RuntimeBuild(
        package="onnxruntime-gpu",
        version="1.24.1",
        providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        openvino=None,
        cuda_built="12.8",
        cudnn_built="9.8.0",
    )
    complete = NvidiaStack(driver="12.9", runtime="12.8", cudnn="9.8.0", tensorrt=None)
    cuda = checks_for(build, complete, monkeypatch)["cuda"]
    assert cuda.status == "ok"
    assert cuda.detail == (
        "CUDAExecutionProvider; built with CUDA 12.8, cuDNN 9.8.0; installed: driver "
        "supports CUDA 12.9, CUDA runtime 12.8, cuDNN 9.8.0"
    )
    no_cudnn = checks_for(build, replace(complete, cudnn=None), monkeypatch)["cuda"]
    assert no_cudnn.status == "warn" and "not found: cuDNN" in no_cudnn.detail
    assert checks_for(build, complete, monkeypatch)["openvino"].detail.startswith("no OpenVINO")
    # onnxruntime-gpu 1.31's build record names CUDA only (the H200 printed "cuDNN ?")
    cuda_only = replace(build, version="1.31.1", cuda_built="13.0", cudnn_built=None)
    detail = checks_for(cuda_only, complete, monkeypatch)["cuda"].detail
    assert "built with CUDA 13.0; installed:" in detail and "?" not in detail


def test_bf16_is_servable_only_where_the_host_runs_it() -> None:
    from radserve.lifecycle.doctor import servable_here
    from radserve.lifecycle.requirements import HostFacts

    gpu = HostFacts("1.31.1", ("CUDAExecutionProvider", "CPUExecutionProvider"), False, 128_000)
    amx = HostFacts("1.24.1", ("OpenVINOExecutionProvider", "CPUExecutionProvider"), True, 4096)
    gated = ("fp32", "fp16", "int8", "bf16")
    assert servable_here(gated, amx) == "servable fp32, fp16, int8, bf16"
    assert servable_here(gated, gpu) == (
        "servable fp32, fp16, int8; bf16 gated but not on this host "
        "(needs OpenVINO and AMX or AVX-512 BF16)"
    )
    assert servable_here(("fp32",), gpu) == "servable fp32"


def test_two_onnxruntime_distributions_are_a_blocking_failure() -> None:
    from importlib import metadata

    from radserve.lifecycle.doctor import onnxruntime_clash

    def versions(**installed: str):
        def version_of(name: str) -> str:
            if name not in installed:
                raise metadata.PackageNotFoundError(name)
            return installed[name]

        return version_of

    assert onnxruntime_clash(versions(**{"onnxruntime-openvino": "1.24.1"})) is None
    clash = onnxruntime_clash(
        versions(**{"onnxruntime-openvino": "1.24.1", "onnxruntime-gpu": "1.31.1"})
    )
    assert clash is not None and clash.startswith(
        "onnxruntime-openvino 1.24.1 and onnxruntime-gpu 1.31.1 are installed"
    )
    assert "uninstall all of them" in clash
    assert onnxruntime_clash(metadata.version) is None  # this environment has exactly one


def test_the_port_check_binds_in_the_address_s_own_family() -> None:
    """An IPv4 socket refused '::1' and '::' ("Address family for hostname not
    supported"), so serve did not start on an IPv6 bind address the settings take."""
    import socket

    from radserve.lifecycle.doctor import port_check

    try:
        taken = socket.socket(socket.AF_INET6)
        taken.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    with taken:
        taken.listen()
        port = taken.getsockname()[1]
        assert port_check("dicom port", "::1", port).status == "fail"
        assert "Address already in use" in port_check("dicom port", "::1", port).detail
    free = port_check("dicom port", "::1", port)
    assert (free.status, free.detail) == ("ok", f"::1:{port} bindable")
    assert port_check("dicom port", "0.0.0.0.0", port).status == "fail"
