"""Sessions check the ONNX graph against model.yaml; providers are chosen by preference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tests.factories.onnx_models import (
    blur3d_model,
    model_spec,
    threshold_logits,
    threshold_model,
)

from radserve.errors import ModelError
from radserve.inference import DeviceInfo, ModelSession, choose_runtime
from radserve.inference.providers import precision_options

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


class _RunLog:
    """The real onnxruntime session, with each run's run options written down."""

    def __init__(self, session: object) -> None:
        self._session = session
        self.runs: list[object] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._session, name)

    def run(self, outputs: object, feed: object, options: object = None) -> object:
        self.runs.append(options)
        return self._session.run(outputs, feed, options)  # type: ignore[attr-defined]


def test_a_3d_session_shrinks_its_arena_with_each_patch_not_with_a_probe(
    tmp_path: Path,
) -> None:
    """release_memory's probe is a whole patch for a graph with a fixed patch size (a
    128^3 nnU-Net patch: seconds); a 3D session shrinks the arena as each patch ends."""
    spec = model_spec(mode="3d", spacing=(2.0, 1.0, 1.0), patch_size=(4, 8, 8))
    session = ModelSession(blur3d_model(tmp_path / "b.onnx"), spec, runtime=CPU)
    log = _RunLog(session._session)
    session._session = log  # type: ignore[assignment]
    x = np.random.default_rng(2).random((2, 1, 4, 8, 8), dtype=np.float32)
    before = session.run(x)
    session.release_memory()
    assert log.runs == [session._shrink]  # one run, the batch itself, with the shrink
    np.testing.assert_array_equal(session.run(x), before)

    slices = ModelSession(threshold_model(tmp_path / "t.onnx"), model_spec(), runtime=CPU)
    log2 = _RunLog(slices._session)
    slices._session = log2  # type: ignore[assignment]
    slices.run(np.zeros((2, 1, 8, 8), np.float32))
    slices.release_memory()  # slice batches keep the arena; the task's end shrinks it
    assert log2.runs == [None, slices._shrink]


def test_provider_preference_and_thread_counts() -> None:
    gpu = choose_runtime(
        _host("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    )
    assert gpu.providers[0] == "TensorrtExecutionProvider" and gpu.device == "cuda:0"
    assert gpu.providers[-1] == "CPUExecutionProvider" and gpu.intra_op_threads == 4
    assert "OpenVINOExecutionProvider" in gpu.reason
    cuda = choose_runtime(_host("CUDAExecutionProvider", "CPUExecutionProvider"), device_id=1)
    assert cuda.provider_options[0]["device_id"] == "1"
    assert any("int8 (QDQ)" in note for note in cuda.notes)  # measured slower there
    assert cuda.provider_options[0]["cudnn_conv_algo_search"] == "HEURISTIC"
    cpu = choose_runtime(_host("AzureExecutionProvider", "CPUExecutionProvider"))
    assert cpu.providers == ("CPUExecutionProvider",) and cpu.intra_op_threads == 8
    assert cpu.as_report()["device"] == "cpu"


def test_cpu_devices_cap_the_batch_and_gpus_take_model_yaml_s() -> None:
    for providers in (
        ("CPUExecutionProvider",),
        ("OpenVINOExecutionProvider", "CPUExecutionProvider"),
    ):
        runtime = choose_runtime(_host(*providers))
        assert runtime.max_batch_size == runtime.batch_cap("2d") == 2
        assert runtime.batch_cap("3d") == 1  # a 3D patch alone (nnU-Net's 128^3: seconds)
        assert runtime.merge_threads == 1  # the provider has every core
    for providers in (
        ("CUDAExecutionProvider", "CPUExecutionProvider"),
        ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    ):
        runtime = choose_runtime(_host(*providers))
        assert runtime.max_batch_size is runtime.batch_cap("3d") is None
        # the cores map a 3D model's outputs back while the GPU runs the next patches
        assert runtime.merge_threads == runtime.host.usable_cores > 1


def test_asking_for_a_missing_provider_fails_loudly() -> None:
    with pytest.raises(ModelError, match="onnxruntime-gpu"):
        choose_runtime(_host("CPUExecutionProvider"), prefer=["CUDAExecutionProvider"])
    with pytest.raises(ModelError, match="unknown execution providers"):
        choose_runtime(_host("CPUExecutionProvider"), prefer=["CudaProvider"])


def test_openvino_runs_on_all_usable_cores_at_float32() -> None:
    ov = choose_runtime(_host("OpenVINOExecutionProvider", "CPUExecutionProvider"))
    assert ov.device == "openvino" and ov.intra_op_threads == 8
    assert ov.provider_options[0] == {
        "device_type": "CPU",
        "precision": "FP32",
        "num_of_threads": "8",
    }


def _bf16_host(flag: str | None) -> DeviceInfo:
    return DeviceInfo(
        "1.0",
        ("OpenVINOExecutionProvider", "CPUExecutionProvider"),
        usable_cores=2,
        logical_cores=2,
        ort_device="CPU",
        cpu_bf16=flag,
    )


def test_bf16_needs_openvino_and_a_cpu_with_native_bfloat16() -> None:
    with pytest.raises(ModelError, match="bf16 runs on OpenVINO's CPU plugin"):
        precision_options(CPU, "bf16")
    with pytest.raises(ModelError, match="AMX or AVX-512 BF16"):
        precision_options(choose_runtime(_bf16_host(None)), "bf16")
    assert not CPU.runs_bf16 and not choose_runtime(_bf16_host(None)).runs_bf16
    runtime = choose_runtime(_bf16_host("amx_bf16"))
    assert runtime.runs_bf16 and "available (amx_bf16)" in " ".join(runtime.notes)
    assert "slower" not in " ".join(runtime.notes)
    avx512 = choose_runtime(_bf16_host("avx512_bf16"))
    assert avx512.runs_bf16 and "without AMX it ran slower" in " ".join(avx512.notes)
    assert "not available" in " ".join(choose_runtime(_bf16_host(None)).notes)
    options = precision_options(runtime, "bf16")
    assert json.loads(options[0]["load_config"]) == {
        "CPU": {"INFERENCE_PRECISION_HINT": "bf16", "CPU_RUNTIME_CACHE_CAPACITY": "0"}
    }
    assert "load_config" not in runtime.provider_options[0]  # the runtime is not changed
    fp32 = precision_options(runtime, "fp32")
    assert json.loads(fp32[0].pop("load_config")) == {"CPU": {"CPU_RUNTIME_CACHE_CAPACITY": "0"}}
    assert fp32 == [dict(o) for o in runtime.provider_options]
    assert precision_options(CPU, "fp32") == [dict(o) for o in CPU.provider_options]


def test_bf16_session_refused_where_it_cannot_run(tmp_path: Path) -> None:
    path = threshold_model(tmp_path / "t.onnx")
    with pytest.raises(ModelError, match="serve fp32"):
        ModelSession(path, model_spec(), runtime=CPU, precision="bf16")


HOST = choose_runtime(threads=2)
RUNS_BF16 = HOST.runs_bf16


@pytest.mark.skipif(not RUNS_BF16, reason="needs onnxruntime-openvino and a bfloat16 CPU")
def test_bf16_session_runs_the_fp32_graph_in_bfloat16(tmp_path: Path) -> None:
    """A bf16 session rounds what fp32 computes exactly: same labels, ~3 significant digits."""
    from tests.factories.onnx_models import conv_model

    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (2, 1, 3, 3)).astype(np.float32)
    path = conv_model(tmp_path / "conv.onnx", w, np.array([0.1, -0.1], np.float32))
    spec = model_spec()
    x = rng.normal(0, 1, (4, 1, 32, 32)).astype(np.float32)
    fp32 = ModelSession(path, spec, runtime=HOST)
    bf16 = ModelSession(path, spec, runtime=HOST, precision="bf16")
    assert fp32.providers_in_use[0] == bf16.providers_in_use[0] == "OpenVINOExecutionProvider"
    reference = ModelSession(path, spec, runtime=CPU).run(x)
    np.testing.assert_allclose(fp32.run(x), reference, rtol=1e-4, atol=1e-4)
    out = bf16.run(x)
    assert out.dtype == np.float32 and bf16.describe()["precision"] == "bf16"
    assert not np.array_equal(out, reference)  # bfloat16 arithmetic really ran
    np.testing.assert_allclose(out, reference, rtol=0.05, atol=0.05)


@pytest.mark.skipif(
    "OpenVINOExecutionProvider" not in HOST.providers, reason="needs onnxruntime-openvino"
)
def test_openvino_pads_a_tasks_last_partial_batch_instead_of_a_new_shape(tmp_path: Path) -> None:
    """OpenVINO builds its kernels anew for every input shape (60 ms of CPU for an INT8
    reference model on an AMX host, against 6-12 ms for one more slice): a batch smaller
    than the one before, of the same slices, runs padded to it, each slice's output the
    one it has alone; a much smaller batch, or another slice shape, runs as it is."""
    from tests.factories.onnx_models import conv_model

    rng = np.random.default_rng(5)
    w = rng.normal(0, 1, (2, 1, 3, 3)).astype(np.float32)
    path = conv_model(tmp_path / "conv.onnx", w, np.array([0.1, -0.1], np.float32))
    session = ModelSession(path, model_spec(), runtime=HOST)
    x = rng.normal(0, 1, (4, 1, 32, 48)).astype(np.float32)
    alone = [session.run(x[i : i + 1]) for i in range(3)]
    session.run(x)
    tail = session.run(x[:3])  # 3 of 4: padded, the session keeps the shape it has
    assert session._last_shape == (4, 1, 32, 48)
    np.testing.assert_array_equal(tail, np.concatenate(alone))
    session.run(x[:1])  # 1 of 4: more padding than slices, run as it is
    assert session._last_shape == (1, 1, 32, 48)
    session.run(x[:, :, :16])
    assert session._last_shape == (4, 1, 16, 48)
    cpu = ModelSession(path, model_spec(), runtime=CPU)  # no per-shape build: never padded
    cpu.run(x)
    cpu.run(x[:3])
    assert cpu._last_shape == (3, 1, 32, 48) and not cpu._pad_partial


def test_on_a_gpu_every_call_has_the_models_batch_size(tmp_path: Path) -> None:
    """A GPU session (``uniform_batch``: model.yaml's batch size there) splits larger
    batches and pads smaller ones, so every call has one shape and a slice's output does
    not depend on what was batched beside it. No GPU here: a CPU session is given the
    uniform batch a CUDA runtime would, and what ONNX Runtime is fed is recorded."""
    from tests.factories.onnx_models import conv_model

    rng = np.random.default_rng(6)
    w = rng.normal(0, 1, (2, 1, 3, 3)).astype(np.float32)
    path = conv_model(tmp_path / "conv.onnx", w, np.array([0.1, -0.1], np.float32))
    session = ModelSession(path, model_spec(batch_size=4), runtime=CPU)
    assert session.uniform_batch is None  # a CPU session runs batches as they come
    x = rng.normal(0, 1, (9, 1, 32, 48)).astype(np.float32)
    alone = np.concatenate([session.run(x[i : i + 1]) for i in range(9)])
    session.uniform_batch = 4  # what ModelSession sets on a cuda:N runtime
    fed: list[int] = []
    inner = session._session

    class Recording:
        def run(self, names, feed, options=None):  # type: ignore[no-untyped-def]
            fed.append(len(next(iter(feed.values()))))
            return inner.run(names, feed, options)

    session._session = Recording()  # type: ignore[assignment]
    for batch in (x[:3], x[:4], x):  # a tail, a full batch, two studies' slices merged
        out = session.run(batch)
        np.testing.assert_array_equal(out, alone[: len(batch)])
    assert set(fed) == {4} and len(fed) == 1 + 1 + 3
    # memory ran out at 4: the uniform size follows the batch that fitted
    session.batch_limit = 2
    fed.clear()
    np.testing.assert_array_equal(session.run(x[:3]), alone[:3])
    assert set(fed) == {2}


_GPU_BUILD = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(_GPU_BUILD, reason="this onnxruntime build has a CUDA provider")
def test_a_listed_gpu_provider_that_cannot_start_is_left_out_with_why() -> None:
    """onnxruntime-gpu lists CUDA and TensorRT on a machine where they cannot start (no
    GPU, no CUDA libraries); a session asked for them falls back model by model. The probe
    starts each once, really, and says what onnxruntime said."""
    from radserve.inference.providers import gpu_provider_failures, provider_start_failure

    assert provider_start_failure("CPUExecutionProvider", {}) is None
    why = provider_start_failure("CUDAExecutionProvider", {"device_id": "0"})
    assert why is not None and why.startswith("onnxruntime ran CPUExecutionProvider instead (")
    assert "CUDAExecutionProvider" in why  # onnxruntime's own words, not a guess
    listed = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    failures = gpu_provider_failures(listed)
    assert set(failures) == {"TensorrtExecutionProvider", "CUDAExecutionProvider"}
    assert gpu_provider_failures(("CPUExecutionProvider",)) == {}  # nothing started


def test_unusable_providers_are_named_in_the_reason_and_refused_when_asked_for() -> None:
    host = DeviceInfo(
        "1.31",
        ("CPUExecutionProvider",),
        usable_cores=4,
        logical_cores=4,
        ort_device="GPU",
        unusable=(("CUDAExecutionProvider", "libcublasLt.so.13: cannot open shared object"),),
    )
    runtime = choose_runtime(host)
    assert runtime.providers == ("CPUExecutionProvider",) and runtime.device == "cpu"
    assert "CUDAExecutionProvider listed but cannot run here: libcublasLt" in runtime.reason
    with pytest.raises(ModelError, match=r"cannot run here \(CUDAExecutionProvider: libcublas"):
        choose_runtime(host, prefer=["CUDAExecutionProvider"])


def test_the_reason_names_the_library_that_did_not_load() -> None:
    """What onnxruntime-gpu 1.31 wrote on an H200 with no TensorRT (colour codes and all)."""
    from radserve.inference.providers import _most_telling_line

    said = (
        "\x1b[1;31m2026-12-04 15:12:16.048063183 [E:onnxruntime:Default, provider_bridge_ort.cc:"
        "2430 operator()] /onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 "
        "onnxruntime::Provider& onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : "
        "FAIL : Failed to load library /opt/torch/.venv/lib/python3.12/site-packages/onnxruntime/"
        "capi/libonnxruntime_providers_tensorrt.so with error: libnvinfer.so.10: cannot open "
        "shared object file: No such file or directory\n\x1b[m\n"
    )
    assert _most_telling_line(said) == (
        "libonnxruntime_providers_tensorrt.so: libnvinfer.so.10: cannot open shared object "
        "file: No such file or directory"
    )
    said = "\x1b[0;93mplain\x1b[m\nsomething failed here"
    assert _most_telling_line(said) == "something failed here"
