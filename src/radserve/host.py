"""What this machine lets the process use: cores (affinity mask, container quota), and
memory that costs nothing until it is written.

Shared by the runtime (ONNX Runtime thread counts), ingest (decoder processes), the array
work of 3D preparation and merging (:func:`call_on_threads`) and the label maps of
inference and post-processing; imports nothing heavy.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

__all__ = [
    "call_on_threads",
    "cpu_bf16_support",
    "cpu_flags",
    "cpu_kernel",
    "kernel_family",
    "lazy_zeros",
    "process_rss_bytes",
    "usable_cores",
]


def process_rss_bytes() -> int | None:
    """This process's resident memory now (Linux ``/proc/self/statm``; None elsewhere)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _cgroup_cpu_limit() -> float | None:
    """cgroup v2 ``cpu.max`` quota in cores, if the process is limited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return float(quota) / float(period)
    except (ValueError, ZeroDivisionError):
        return None


def usable_cores() -> int:
    """Cores this process may run on: affinity mask, capped by a container quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.floor(limit)))
    return max(1, cores)


def call_on_threads(calls: Sequence[Callable[[], None]], threads: int, name: str) -> None:
    """Run ``calls``, which touch nothing of each other's, on up to ``threads`` threads
    named ``name`` (in turn on this thread when one is enough): numpy's and SciPy's array
    loops let go of the GIL, so large array work spreads over the cores. The first
    failure is raised once every call has ended."""
    workers = min(threads, len(calls))
    if workers <= 1:
        for call in calls:
            call()
        return
    with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
        list(pool.map(lambda call: call(), calls))


# CPU flags (Linux /proc/cpuinfo names) that run bfloat16 matrix arithmetic natively.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
# The instruction sets int8 convolutions run on, best first. With AMX or VNNI the 8-bit
# products are summed exactly into 32 bits; with only AVX-512 BW or AVX2 (vpmaddubsw)
# pairs of products are summed into 16 bits first, which saturates, so kernels there
# compute differently (ONNX Runtime quantizes with ``reduce_range`` for such CPUs).
INT8_CPU_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512bw", "avx2")
# Kernels that compute the same numbers for a precision: a gate measured on one holds
# for the others of its family. An fp16 file is computed in float32 by both CPU
# providers (OpenVINO's plugin at ONNX Runtime's default FP32 precision; the CPU
# provider casts), so it depends on no CPU flag.
_KERNEL_FAMILY = {
    "amx_int8": "exact 32-bit sums of int8 products, AMX or VNNI",
    "avx512_vnni": "exact 32-bit sums of int8 products, AMX or VNNI",
    "avx_vnni": "exact 32-bit sums of int8 products, AMX or VNNI",
    "avx512bw": "16-bit sums of int8 product pairs that can saturate, no VNNI",
    "avx2": "16-bit sums of int8 product pairs that can saturate, no VNNI",
    "amx_bf16": "native bfloat16",
    "avx512_bf16": "native bfloat16",
    "float32": "float32",
}


# Where the CPU's flags are read (a test points it at a file of another CPU's flags).
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path | None = None) -> frozenset[str]:
    """The first CPU's flags from ``/proc/cpuinfo`` (empty where there is none); read
    once per path: a registry asks on every model file it hands out."""
    return _flags(cpuinfo or CPUINFO)


@functools.lru_cache(maxsize=8)
def _flags(cpuinfo: Path) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_bf16_support(cpuinfo: Path | None = None) -> str | None:
    """The CPU's native bfloat16 instruction set (``amx_bf16``, ``avx512_bf16``), or
    ``None``: without one, a bf16 hint is emulated and slower than float32.

    Only AMX made bf16 faster where measured (:func:`bf16_slower_reason`); either way
    the numbers are bfloat16's, so both may serve it."""
    return cpu_kernel("bf16", cpuinfo)


def cpu_kernel(precision: str, cpuinfo: Path | None = None) -> str | None:
    """The instruction set this CPU computes ``precision`` with through a CPU provider
    (an ``INT8_CPU_FLAGS`` or ``BF16_CPU_FLAGS`` name, or ``float32`` for fp16);
    ``None`` for fp32 (the reference everything is gated against) or where nothing
    listed is present.

    Why it matters: a variant's accuracy gate measured the numbers one kind of kernel
    computes; on this development machine's AVX2-only CPU the INT8 lesion model, gated
    on an AMX CPU, missed the lesion a float32 run found (README, "Precision gates and
    the CPU")."""
    flags = cpu_flags(cpuinfo)
    if precision == "int8":
        return next((f for f in INT8_CPU_FLAGS if f in flags), None)
    if precision == "bf16":
        return next((f for f in BF16_CPU_FLAGS if f in flags), None)
    if precision == "fp16":
        return "float32"
    return None


def kernel_family(kernel: str | None) -> str:
    """What a kernel from :func:`cpu_kernel` computes; equal families, equal numbers."""
    if kernel is None:
        return "no vector kernel"
    return _KERNEL_FAMILY.get(kernel, kernel)


def bf16_slower_reason(native: str | None) -> str | None:
    """Why bfloat16 arithmetic would run slower than float32 on a CPU whose native
    bfloat16 support is ``native`` (:func:`cpu_bf16_support`); ``None`` with AMX.

    Measured on two development machines: with AMX, OpenVINO inference 2.6-2.8x and a
    bf16-autocast training step 1.9x float32's speed; with AVX-512 BF16 alone, 0.6-0.8x
    and 0.93x (0.27 vs 0.25 s a step of the lesion U-Net at batch 16).
    """
    if native is None:
        return "this CPU has no native bfloat16 (emulated: slower than float32)"
    if native != "amx_bf16":
        return f"this CPU has {native} but no AMX: bfloat16 measured slower than float32"
    return None


def lazy_zeros(shape: tuple[int, ...], dtype: np.typing.DTypeLike) -> np.ndarray:
    """A zero-filled array whose pages become resident only when written.

    ``np.zeros`` gives that only while glibc serves the request with a fresh ``mmap``;
    below its (self-raising) threshold a recycled heap block is cleared, and every page
    is resident at once. Label maps are mostly background: written only where a label
    lands, a lesion map over a 20 MB region then costs a few pages. The mapping is
    returned to the system when the array is freed.
    """
    dt = np.dtype(dtype)
    private = getattr(mmap, "MAP_PRIVATE", None)
    if private is None:  # Windows: no private anonymous maps through this module
        return np.zeros(shape, dt)
    count = math.prod(shape)
    # Private, so reading an unwritten page maps the shared zero page, not a new one.
    buffer = mmap.mmap(-1, max(1, count * dt.itemsize), flags=private)
    return np.frombuffer(buffer, dtype=dt, count=count).reshape(shape)
