"""Whether this host can serve a bundle: its ``requires:`` section (model.yaml) against
ONNX Runtime's version, providers, supported opset, precisions and free memory, and its
graphs' own opsets and IR version against what this ONNX Runtime loads.

Returns reasons rather than raising, so install refuses with every reason at once and
``radserve doctor`` can print them in its table.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from radserve.models.bf16 import OPENVINO, bf16_refusal, host_runs_bf16
from radserve.models.manifest import ModelSpec

# Highest ai.onnx opset each ONNX Runtime minor release implements (its release notes):
# for a host described by its version only (tests, doctor's table of another host); the
# real host's is asked of its ONNX Runtime (:func:`loaded_opset`).
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
    probed_opset: int | None = None  # the ai.onnx opset this ONNX Runtime loads, asked of it

    @property
    def max_opset(self) -> int:
        if self.probed_opset is not None:
            return self.probed_opset
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
    return HostFacts(
        ort_version=host.ort_version,
        providers=tuple(host.available_providers),
        runs_bf16=host_runs_bf16(host.available_providers, cpu_bf16_support()),
        free_memory_mb=free_memory_mb() if os.name == "posix" else None,
        probed_opset=loaded_opset(),
    )


def _stub_refusal(opsets: Iterable[tuple[str, int]], ir_version: int) -> str | None:
    """ONNX Runtime's reason to refuse a graph that imports ``opsets`` and has
    ``ir_version`` (None: it loads one). The stub holds one Identity node and no weights:
    only the versions are put to the runtime, whatever the graph's size or precision."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "stub", [x], [y])
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = ir_version
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its warnings about old opsets are not ours to print
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types
        return str(exc)
    return None


@functools.cache
def loaded_opset(limit: int = 64) -> int:
    """The highest ai.onnx opset this ONNX Runtime loads (binary search over stubs)."""
    low, high = 1, limit
    while low < high:
        middle = (low + high + 1) // 2
        if _stub_refusal([("", middle)], 8) is None:
            low = middle
        else:
            high = middle - 1
    return low


def graph_refusal(opsets: Iterable[tuple[str, int]], ir_version: int) -> str | None:
    """Why this host's ONNX Runtime would not load a graph with these opset imports and
    IR version, in one line (None: it would). Checked at install, so a graph no session
    here can open is refused there, not at its first deploy."""
    import onnxruntime as ort

    text = _stub_refusal(opsets, ir_version)
    if text is None:
        return None
    runtime = f"ONNX Runtime {ort.__version__}"
    ir = re.search(r"IR version: (\d+), max supported IR version: (\d+)", text)
    if ir:
        return f"its IR version is {ir[1]}; {runtime} reads up to {ir[2]}"
    opset = re.search(
        r"Opset (\d+) is under development.*domain (\S+) is till opset (\d+)", text, re.S
    )
    if opset:
        return f"it imports opset {opset[1]} of {opset[2]}; {runtime} implements up to {opset[3]}"
    # the last line, less the C++ source location and signature ONNX Runtime puts first
    last = text.strip().splitlines()[-1] if text.strip() else "no reason given"
    detail = re.sub(r"^.*?\) ", "", last)[:300]
    return f"{runtime} does not load it: {detail}"


def unmet_requirements(
    spec: ModelSpec, host: HostFacts, *, providers: Sequence[str] = ()
) -> list[str]:
    """Why ``host`` cannot serve ``spec`` (empty: it can).

    ``providers``: the execution providers the server serves with, in order (its session
    pool's, :attr:`radserve.service.catalog.Catalog.serving_providers`: install, import,
    deploy and ``radserve doctor`` pass them); ``requires.providers`` and a ``bf16``
    requirement are met only by those. Empty: every provider the host offers (the
    server's own choice where ``runtime.providers`` is unset). Before 2026-12-07 they were
    always the host's: a server set to ``runtime.providers: [CPUExecutionProvider]`` on
    this OpenVINO host installed and deployed a model requiring OpenVINO, and served it
    on the CPU provider."""
    need = spec.requires
    serving = tuple(providers) or host.providers
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
    if need.providers and not set(need.providers) & set(serving):
        reasons.append(_providers_unmet(spec, host, tuple(providers)))
    # the rule the registry's "servable" applies too (radserve.models.bf16)
    bf16 = bf16_refusal(providers, host_runs_bf16=host.runs_bf16)
    if "bf16" in need.precision and bf16 is not None:
        reasons.append(f"{spec.key} needs bf16, which {bf16}")
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


def _providers_unmet(spec: ModelSpec, host: HostFacts, providers: tuple[str, ...]) -> str:
    """The reason for a ``requires.providers`` that the serving providers miss: what the
    model needs, what the server serves with, and what would change that."""
    need = spec.requires.providers
    said = f"{spec.key} needs one of the execution providers {', '.join(need)}"
    offered = [p for p in need if p in host.providers]
    if not providers:
        return f"{said}; this host offers {', '.join(host.providers)}"
    if offered:  # the host has one; runtime.providers leaves it out
        return (
            f"{said}; this server serves with {', '.join(providers)} (runtime.providers), "
            f"which leaves out {', '.join(offered)} that this host offers: add "
            f"{'it' if len(offered) == 1 else 'one of them'} to runtime.providers to serve "
            "this model"
        )
    return (
        f"{said}; this server serves with {', '.join(providers)} and this host offers "
        f"{', '.join(host.providers)}: install the onnxruntime package that has one of "
        "them (onnxruntime-gpu, onnxruntime-openvino) and name it in runtime.providers"
    )


__all__ = [
    "OPENVINO",
    "HostFacts",
    "free_memory_mb",
    "graph_refusal",
    "host_facts",
    "loaded_opset",
    "unmet_requirements",
]
