"""Whether this host can serve a bundle: its ``requires:`` section (model.yaml) against
ONNX Runtime's version, providers, supported opset, precisions and free memory.

Returns reasons rather than raising, so install refuses with every reason at once and
``radserve doctor`` can print them in its table.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from radserve.models.manifest import ModelSpec

# Highest ai.onnx opset each ONNX Runtime minor release implements (its release notes);
# a release newer than the table is assumed to support at least the last entry.
_ORT_MAX_OPSET: tuple[tuple[tuple[int, int], int], ...] = (
    ((1, 14), 18),
    ((1, 15), 19),
    ((1, 17), 20),
    ((1, 18), 21),
    ((1, 20), 21),
    ((1, 21), 22),
    ((1, 23), 23),
)


@dataclass(frozen=True)
class HostFacts:
    """What the host offers, probed once (:func:`host_facts`)."""

    ort_version: str
    providers: tuple[str, ...]
    runs_bf16: bool
    free_memory_mb: int | None

    @property
    def max_opset(self) -> int:
        ours = _version_tuple(self.ort_version)[:2]
        best = 0
        for release, opset in _ORT_MAX_OPSET:
            if ours >= release:
                best = opset
        return best


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3]) or (0,)


def free_memory_mb() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        return None
    return None


def host_facts() -> HostFacts:
    """Probe ONNX Runtime and the OS (cheap: no session is created)."""
    from radserve.host import cpu_bf16_support
    from radserve.inference.providers import probe_host

    host = probe_host()
    bf16 = "OpenVINOExecutionProvider" in host.available_providers and bool(cpu_bf16_support())
    return HostFacts(
        ort_version=host.ort_version,
        providers=tuple(host.available_providers),
        runs_bf16=bf16,
        free_memory_mb=free_memory_mb() if os.name == "posix" else None,
    )


def unmet_requirements(spec: ModelSpec, host: HostFacts) -> list[str]:
    """Why ``host`` cannot serve ``spec`` (empty: it can)."""
    need = spec.requires
    reasons: list[str] = []
    if need.onnxruntime and _version_tuple(host.ort_version) < _version_tuple(need.onnxruntime):
        reasons.append(
            f"{spec.key} needs ONNX Runtime >= {need.onnxruntime}; this host has {host.ort_version}"
        )
    if need.opset is not None and need.opset > host.max_opset:
        reasons.append(
            f"{spec.key} needs ONNX opset {need.opset}; ONNX Runtime {host.ort_version} "
            f"implements up to {host.max_opset}"
        )
    if need.providers and not set(need.providers) & set(host.providers):
        reasons.append(
            f"{spec.key} needs one of the execution providers {', '.join(need.providers)}; "
            f"this host offers {', '.join(host.providers)}"
        )
    if "bf16" in need.precision and not host.runs_bf16:
        reasons.append(
            f"{spec.key} needs bf16, which needs OpenVINO on a CPU with AMX or AVX-512 BF16; "
            "this host has neither"
        )
    if (
        need.memory_mb is not None
        and host.free_memory_mb is not None
        and need.memory_mb > host.free_memory_mb
    ):
        reasons.append(
            f"{spec.key} needs {need.memory_mb} MB of free memory; {host.free_memory_mb} MB "
            "are available"
        )
    return reasons


__all__ = ["HostFacts", "free_memory_mb", "host_facts", "unmet_requirements"]
