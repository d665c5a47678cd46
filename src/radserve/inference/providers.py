"""Which ONNX Runtime execution provider a host gets, and why.

Preference: TensorRT > CUDA > OpenVINO > CPU, among the providers this onnxruntime
build offers. CPU is always appended as the fallback for operators an accelerator does
not implement. The CPU thread count honours the process's CPU affinity and a cgroup
(container) CPU quota, so a container limited to 4 cores does not start 64 threads.
The choice is logged and is a plain frozen object the pipeline puts in its report.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from radserve.errors import ModelError
from radserve.host import bf16_slower_reason, cpu_bf16_support, usable_cores
from radserve.models.bf16 import ServingProviders, host_runs_bf16

logger = logging.getLogger(__name__)

PREFERENCE = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "OpenVINOExecutionProvider",
    "CPUExecutionProvider",
)
CPU_MAX_BATCH = 2  # see RuntimeChoice.max_batch_size
CPU_MAX_PATCH_BATCH = 1  # see RuntimeChoice.batch_cap

_DEVICE_KIND = {
    "TensorrtExecutionProvider": "cuda",
    "CUDAExecutionProvider": "cuda",
    "OpenVINOExecutionProvider": "openvino",
    "CPUExecutionProvider": "cpu",
}


@dataclass(frozen=True)
class DeviceInfo:
    """What the host offers: cores usable by this process and onnxruntime's providers."""

    ort_version: str
    available_providers: tuple[str, ...]
    usable_cores: int
    logical_cores: int
    ort_device: str
    # The CPU's native bfloat16 instructions (amx_bf16, avx512_bf16), if any.
    cpu_bf16: str | None = None
    # Providers onnxruntime lists but could not start a session with here, and why
    # (onnxruntime-gpu lists CUDA and TensorRT whether or not their libraries load).
    unusable: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RuntimeChoice:
    """Providers (in order, with options) for sessions on one device, and the reason."""

    providers: tuple[str, ...]
    provider_options: tuple[dict[str, str], ...]
    device: str
    intra_op_threads: int
    reason: str
    host: DeviceInfo
    notes: tuple[str, ...] = field(default=())

    @property
    def primary(self) -> str:
        return self.providers[0]

    @property
    def max_batch_size(self) -> int | None:
        """Largest batch worth sending to this device; ``None``: model.yaml's ``batch_size``.

        On a CPU (OpenVINO or ONNX Runtime's CPU provider) larger batches are no faster
        per slice, while the network's activations, and so the peak memory, grow with
        the batch. Measured on the 2-core development machine, organs U-Net at 320 x 384:
        OpenVINO 14.0 / 14.6 / 14.7 / 15.8 ms per slice at batch 1 / 2 / 4 / 8, peak
        154 / 186 / 253 / 386 MiB; CPU provider 22.3 / 20.5 / 20.7 / 23.2 ms. GPUs
        need the batch to fill the device.
        """
        return None if _DEVICE_KIND[self.primary] == "cuda" else CPU_MAX_BATCH

    def batch_cap(self, mode: str) -> int | None:
        """:attr:`max_batch_size` for a model of input ``mode`` (``2d``, ``2.5d``, ``3d``).

        On a CPU a 3D patch is sent alone: one patch (nnU-Net's 128^3) already gives
        every core millions of voxels per operator, and a second one doubles the
        network's activations (gigabytes at that size). Measured on the 2-core
        development machine (issue 18, nnU-Net's default network, 4 patches of 128^3,
        under load): OpenVINO 46.4 s at batch 1 vs 55.5 s at batch 2, peak RSS 1.8 vs
        3.1 GB; see the README's nnU-Net section.
        """
        if _DEVICE_KIND[self.primary] == "cuda":
            return None
        return CPU_MAX_PATCH_BATCH if mode == "3d" else CPU_MAX_BATCH

    @property
    def merge_threads(self) -> int:
        """Threads a 3D task maps its outputs back with: every usable core where the
        network runs on a GPU (the way back is then the critical path: 6.6 of 11.5 s for
        nnU-Net's 64 patches of 128^3 on session 23's H200), one where it runs on the
        CPU, whose provider already has every core."""
        return self.host.usable_cores if _DEVICE_KIND[self.primary] == "cuda" else 1

    @property
    def serving(self) -> ServingProviders:
        """What a model registry judges bundles on for sessions of this runtime (the
        server's catalog and ``radserve run`` alike)."""
        return ServingProviders(
            tuple(self.providers),
            host_runs_bf16(self.host.available_providers, self.host.cpu_bf16),
        )

    @property
    def runs_bf16(self) -> bool:
        """Whether sessions may run at ``bf16`` here (see :func:`precision_options`): the
        rule the registry, the requirements and doctor apply (:mod:`radserve.models.bf16`),
        on this runtime's providers."""
        return self.serving.bf16_refusal() is None

    def as_report(self) -> dict[str, object]:
        """JSON-ready summary for job reports and ``/readyz``."""
        out = asdict(self)
        out["provider_options"] = [dict(o) for o in self.provider_options]
        return out


def probe_host() -> DeviceInfo:
    """What onnxruntime and the OS offer this process. Cheap on a CPU build; where
    onnxruntime lists a GPU provider, that provider is started once per process
    (:func:`gpu_provider_failures`) and left out if it cannot start."""
    listed = tuple(ort.get_available_providers())
    failures = gpu_provider_failures(listed)
    return DeviceInfo(
        ort_version=ort.__version__,
        available_providers=tuple(p for p in listed if p not in failures),
        usable_cores=usable_cores(),
        logical_cores=os.cpu_count() or 1,
        ort_device=ort.get_device(),
        cpu_bf16=cpu_bf16_support(),
        unusable=tuple(failures.items()),
    )


GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


@functools.lru_cache(maxsize=4)
def gpu_provider_failures(listed: tuple[str, ...], device_id: int = 0) -> dict[str, str]:
    """The GPU providers among ``listed`` that cannot start a session here, with why.

    onnxruntime-gpu lists CUDA and TensorRT whenever their provider libraries are in the
    wheel, also where the CUDA, cuDNN or TensorRT libraries they load are missing or the
    machine has no GPU; a session asked for one then falls back, model by model, with a
    warning (and TensorRT's failure printed on stdout). So each is started once on a
    one-node graph, after :func:`preload_gpu_libraries`, and judged by what the session
    actually runs on.
    """
    wanted = [p for p in GPU_PROVIDERS if p in listed]
    if not wanted:
        return {}
    preload_gpu_libraries()
    failures: dict[str, str] = {}
    for provider in wanted:
        why = provider_start_failure(provider, _options(provider, device_id, None, None, 1))
        if why is not None:
            failures[provider] = why
            logger.warning("%s is listed by onnxruntime but cannot run here: %s", provider, why)
    # onnxruntime-gpu 1.31 warns "No registered plugin EP device found for
    # 'CUDAExecutionProvider'" on the standard error at every session it then starts on
    # CUDA, which runs (H200, 2026-12-04). Each ModelSession reports the providers it
    # runs on itself, so onnxruntime's process-wide log keeps its errors only.
    ort.set_default_logger_severity(3)
    return failures


def provider_start_failure(provider: str, options: dict[str, str]) -> str | None:
    """Why ``provider`` could not run a one-node graph in this process, or None if it did.

    The why is what onnxruntime said: its exception, or what it printed, warned or wrote
    on the standard error while falling back (a provider library that does not load is
    reported there only; it is written back there after the probe).
    """
    options_ = ort.SessionOptions()
    options_.log_severity_level = 4  # the answer is read from the session, not its log
    printed = io.StringIO()
    with _stderr_captured() as stderr, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(printed):  # onnxruntime's fallback print()s
                session = ort.InferenceSession(
                    _probe_graph(),
                    sess_options=options_,
                    providers=[provider, "CPUExecutionProvider"],
                    provider_options=[options, {}],
                )
                session.run(None, {"x": _PROBE_INPUT})
            used = session.get_providers()[0]
        except Exception as exc:  # onnxruntime raises its own, untyped, exception family
            return _most_telling_line(str(exc)) or type(exc).__name__
    if used == provider:
        return None
    said = "\n".join([stderr.getvalue(), printed.getvalue(), *(str(w.message) for w in warned)])
    return f"onnxruntime ran {used} instead ({_most_telling_line(said) or 'no reason given'})"


@contextlib.contextmanager
def _stderr_captured() -> Iterator[io.StringIO]:
    """File descriptor 2 into a buffer for the block (onnxruntime's C++ log writes there),
    then written back to the real standard error."""
    captured = io.StringIO()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            captured.write(text)
            if text:
                sys.stderr.write(text)


_PROBE_INPUT = np.ones((1, 4), np.float32)


@functools.lru_cache(maxsize=1)
def _probe_graph() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime since 1.10 reads
    return model.SerializeToString()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LIBRARY_FAILURE = re.compile(r"Failed to load library (\S+) with error: (.+)")


def _most_telling_line(text: str) -> str:
    """The line that says most, without colour codes: a library that failed to load
    (as ``libonnxruntime_providers_tensorrt.so: libnvinfer.so.10: cannot open shared
    object file...``), else an error or failure, else the first line."""
    lines = [_ANSI.sub("", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and "*****" not in ln]
    for line in lines:
        found = _LIBRARY_FAILURE.search(line)
        if found:
            return f"{Path(found[1]).name}: {found[2]}"[:300]
    telling = [ln for ln in lines if any(w in ln.lower() for w in ("error", "fail", "cannot"))]
    return (telling or lines or [""])[0][:300]


@functools.lru_cache(maxsize=1)
def preload_gpu_libraries() -> str:
    """Load CUDA and cuDNN from the ``nvidia-*`` wheels beside onnxruntime-gpu, once.

    ``pip install onnxruntime-gpu[cuda,cudnn]`` puts them in site-packages, where the
    dynamic loader does not look; onnxruntime finds them only after this (or after
    ``import torch`` of the same CUDA major). What it printed is returned and logged.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return ""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            preload()
    except Exception as exc:  # a missing folder, an old onnxruntime: keep the default paths
        printed.write(f"preload_dlls failed: {exc}")
    text = printed.getvalue().strip()
    if text:
        logger.info("onnxruntime GPU library preload: %s", text.replace("\n", "; ")[:500])
    return text


def choose_runtime(
    host: DeviceInfo | None = None,
    *,
    prefer: Sequence[str] | None = None,
    device_id: int = 0,
    threads: int | None = None,
    gpu_mem_limit_bytes: int | None = None,
    trt_cache_dir: Path | None = None,
) -> RuntimeChoice:
    """Pick providers for one device.

    ``prefer`` restricts and orders the candidates (e.g. ``["CPUExecutionProvider"]`` to
    force CPU); an unknown or unavailable name there is a :class:`ModelError`, since a
    site that asked for a GPU should not silently run on CPU. ``threads`` overrides the
    CPU thread count.
    """
    host = host or probe_host()
    available = set(host.available_providers)
    order = tuple(prefer) if prefer else PREFERENCE
    unknown = [p for p in order if p not in _DEVICE_KIND]
    if unknown:
        raise ModelError(f"unknown execution providers {unknown}; known: {list(PREFERENCE)}")
    if prefer:
        missing = [p for p in order if p not in available]
        broken = [f"{p}: {why}" for p, why in host.unusable if p in missing]
        if broken:
            raise ModelError(
                f"execution providers asked for cannot run here ({'; '.join(broken)}); "
                "`radserve doctor` lists the CUDA, cuDNN and TensorRT libraries it finds"
            )
        if missing:
            raise ModelError(
                f"execution providers {missing} were asked for but this onnxruntime "
                f"{host.ort_version} offers {sorted(available)}; install the matching "
                "onnxruntime package (onnxruntime-gpu, onnxruntime-openvino) or drop them"
            )
    chosen = [p for p in order if p in available]
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    primary = chosen[0]
    kind = _DEVICE_KIND[primary]
    cores = threads or host.usable_cores
    # With a GPU the CPU mostly prepares batches: leave it cores for that. OpenVINO runs
    # on this CPU, with all of it.
    intra = max(1, min(4, cores // 2)) if kind == "cuda" else cores
    options = tuple(
        _options(p, device_id, gpu_mem_limit_bytes, trt_cache_dir, intra) for p in chosen
    )
    broken = dict(host.unusable)
    skipped = [p for p in PREFERENCE if p not in available and p not in broken]
    reason = (
        f"{primary} is the most preferred of the providers onnxruntime {host.ort_version} "
        f"offers ({', '.join(host.available_providers)})"
        + (f"; not available: {', '.join(skipped)}" if skipped else "")
        + "".join(f"; {p} listed but cannot run here: {why}" for p, why in broken.items())
    )
    notes: list[str] = []
    if primary == "TensorrtExecutionProvider":
        notes.append("TensorRT builds an engine per new input shape; engines are cached")
    if primary == "CUDAExecutionProvider":
        notes.append(
            "int8 (QDQ) graphs run through the CUDA provider without int8 kernels: slower "
            "than fp32 where measured (H200, reference models 0.80-0.84x; fp16 no faster)"
        )
    if primary == "OpenVINOExecutionProvider":
        if host.cpu_bf16 is None:
            notes.append("bf16 precision: not available (needs AMX or AVX-512 BF16)")
        elif bf16_slower_reason(host.cpu_bf16):
            notes.append(
                f"bf16 precision: available ({host.cpu_bf16}), but without AMX it ran "
                "slower than fp32 where measured"
            )
        else:
            notes.append(f"bf16 precision: available ({host.cpu_bf16})")
    choice = RuntimeChoice(
        providers=tuple(chosen),
        provider_options=options,
        device=f"cuda:{device_id}" if kind == "cuda" else kind,
        intra_op_threads=intra,
        reason=reason,
        host=host,
        notes=tuple(notes),
    )
    logger.info(
        "runtime: %s on %s with %d CPU threads (%s)",
        "+".join(choice.providers),
        choice.device,
        intra,
        reason,
    )
    return choice


def precision_options(runtime: RuntimeChoice, precision: str) -> list[dict[str, str]]:
    """Provider options for sessions at ``precision``.

    ``bf16`` is the fp32 graph run in bfloat16 by OpenVINO's CPU plugin (weights and
    activations rounded to 8 mantissa bits, accumulation in float32); it needs that
    provider and a CPU with native bfloat16, because emulated it is slower than float32.
    """
    options = [dict(o) for o in runtime.provider_options]
    if precision != "bf16":
        if runtime.primary == "OpenVINOExecutionProvider":
            options[0]["load_config"] = json.dumps(openvino_cpu_config())
        return options
    if runtime.primary != "OpenVINOExecutionProvider":
        raise ModelError(
            f"bf16 runs on OpenVINO's CPU plugin, but this runtime uses {runtime.primary} "
            f"({runtime.reason}); serve fp32, or install onnxruntime-openvino"
        )
    if runtime.host.cpu_bf16 is None:
        raise ModelError(
            "bf16 needs a CPU with native bfloat16 arithmetic (AMX or AVX-512 BF16) and this "
            "one has neither, so it would be slower than fp32; serve fp32"
        )
    config = openvino_cpu_config()
    config["CPU"]["INFERENCE_PRECISION_HINT"] = "bf16"
    options[0]["load_config"] = json.dumps(config)
    return options


def openvino_cpu_config() -> dict[str, dict[str, str]]:
    """OpenVINO CPU-plugin properties every radserve session gets: no per-shape caches.

    Every study has its own crop, so every study brings new input shapes, and OpenVINO's
    CPU plugin kept about 2 MiB per shape it had seen, per model, for the life of the
    process: measured 163 MiB after 80 shapes of the organ model, growing linearly,
    where ONNX Runtime's CPU provider kept nothing. Two caches hold them, the plugin's
    runtime cache (``CPU_RUNTIME_CACHE_CAPACITY``) and oneDNN's primitive cache (read
    from ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` when the plugin first runs); with both at 0
    the 16 shapes that kept 31 MiB kept 1.2 MiB, for about 10-20 ms of CPU per shape
    change (a task runs one shape, plus its last, partial batch). An operator's own
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is left as set.
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
    return {"CPU": {"CPU_RUNTIME_CACHE_CAPACITY": "0"}}


def _options(
    provider: str,
    device_id: int,
    mem_limit: int | None,
    trt_cache_dir: Path | None,
    threads: int,
) -> dict[str, str]:
    if provider == "CUDAExecutionProvider":
        opts = {
            "device_id": str(device_id),
            # Grow the arena by what is asked, not by powers of two: studies vary in size.
            "arena_extend_strategy": "kSameAsRequested",
            # EXHAUSTIVE re-benchmarks every new input shape, and every study has one.
            "cudnn_conv_algo_search": "HEURISTIC",
            "do_copy_in_default_stream": "1",
        }
        if mem_limit:
            opts["gpu_mem_limit"] = str(mem_limit)
        return opts
    if provider == "TensorrtExecutionProvider":
        opts = {"device_id": str(device_id), "trt_engine_cache_enable": "1"}
        if trt_cache_dir is not None:
            opts["trt_engine_cache_path"] = str(trt_cache_dir)
        return opts
    if provider == "OpenVINOExecutionProvider":
        # float32 unless a session asks for bf16 (precision_options): OpenVINO's own CPU
        # default on AMX hardware is bf16, which must pass the accuracy gate first.
        return {"device_type": "CPU", "precision": "FP32", "num_of_threads": str(threads)}
    return {}


__all__ = [
    "GPU_PROVIDERS",
    "PREFERENCE",
    "DeviceInfo",
    "RuntimeChoice",
    "choose_runtime",
    "gpu_provider_failures",
    "openvino_cpu_config",
    "precision_options",
    "probe_host",
]
