"""One device of a Ray cluster: a long-lived actor holding that device's warm sessions.

The actor does nothing but run batches: the scheduler in the serving process decides
which batch of which study runs next on which worker
(:mod:`radserve.scheduling.ray_executor`). A batch arrives as an ``ObjectRef`` to a
numpy array in Ray's object store (read zero-copy from shared memory on the same node)
and its output goes back the same way.

Each session is bound to the actor's device: a CPU slot runs ONNX Runtime (or
OpenVINO) with that slot's thread budget, so two CPU slots on one host split its cores
instead of both starting one thread per core; a GPU worker gets the GPU Ray assigned it
(``CUDA_VISIBLE_DEVICES`` set by Ray, so the session's ``device_id`` is 0 of the visible
ones).

This module imports Ray only inside :func:`actor_class`: Ray is an optional extra
(``pip install 'radserve[ray]'``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from radserve.errors import RadserveError

_SLOT = re.compile(
    r"^(?P<kind>cpu|gpu)(?::(?P<arg>\d+(?:\.\d+)?))?(?:@(?P<place>[A-Za-z0-9_.-]+))?$"
)
# how much of a placement resource a worker asks for: any node that has it will do
PLACE_SHARE = 0.001


class RayExecutorError(RadserveError):
    """The Ray executor cannot start or lost its cluster (not a study's fault)."""

    code = "ray_executor_failed"


@dataclass(frozen=True)
class DeviceSlot:
    """One worker's device. ``cpu:N``: a CPU slot with N threads (its Ray ``num_cpus``);
    ``gpu`` or ``gpu:F``: a GPU, or the fraction F of one (two workers on one GPU: 0.5).
    A suffix ``@RESOURCE`` places the worker on a node that offers that Ray custom
    resource (``ray start --resources '{"RESOURCE": 1}'``), e.g. ``gpu@node_b``."""

    name: str
    kind: str
    threads: int
    gpu_fraction: float = 0.0
    place: str | None = None

    @classmethod
    def parse(cls, text: str, index: int) -> DeviceSlot:
        match = _SLOT.match(text.strip())
        if match is None:
            raise ValueError(
                f"ray.devices entry {text!r}: expected cpu, cpu:<threads>, gpu or "
                "gpu:<fraction>, optionally followed by @<Ray resource> (a node to run on)"
            )
        kind, arg, place = match["kind"], match["arg"], match["place"]
        if kind == "cpu":
            threads = int(float(arg)) if arg else 1
            if threads < 1:
                raise ValueError(f"ray.devices entry {text!r}: a CPU slot needs >= 1 thread")
            return cls(f"ray-cpu{index}", "cpu", threads, place=place)
        fraction = float(arg) if arg else 1.0
        if not 0 < fraction <= 1:
            raise ValueError(f"ray.devices entry {text!r}: a GPU share must be in (0, 1]")
        return cls(f"ray-gpu{index}", "gpu", 2, fraction, place=place)

    def actor_options(self, max_restarts: int) -> dict[str, Any]:
        """Ray resources for the actor: its CPU threads (CPU slot) or GPU share, and a
        sliver of its placement resource."""
        options: dict[str, Any] = {"max_restarts": max_restarts, "max_task_retries": 0}
        if self.kind == "cpu":
            options["num_cpus"] = self.threads
        else:
            options["num_cpus"] = 1
            options["num_gpus"] = self.gpu_fraction
        if self.place is not None:
            options["resources"] = {self.place: PLACE_SHARE}
        return options


class DeviceWorker:
    """The actor's body (plain Python, wrapped by :func:`actor_class`)."""

    def __init__(self, slot: DeviceSlot, providers: tuple[str, ...] = ()) -> None:
        from radserve.inference.providers import (
            GPU_PROVIDERS,
            PREFERENCE,
            choose_runtime,
            probe_host,
        )

        self.slot = slot
        host = probe_host()
        if slot.kind == "cpu":
            # A CPU slot never takes a GPU provider, even if this node has one: not by
            # the host's default preference either (TensorRT > CUDA come first there).
            offered = providers or tuple(p for p in PREFERENCE if p in host.available_providers)
            prefer = tuple(p for p in offered if p not in GPU_PROVIDERS) or None
        else:
            prefer = providers or None
        self.runtime = choose_runtime(host, prefer=prefer, device_id=0, threads=slot.threads)
        if slot.kind == "gpu" and self.runtime.device == "cpu":
            raise RayExecutorError(
                f"worker {slot.name} was given a GPU share but onnxruntime here offers "
                f"{list(self.runtime.host.available_providers)}; install onnxruntime-gpu"
            )
        self._sessions: dict[tuple[str, str], Any] = {}

    def ping(self) -> dict[str, Any]:
        """Who this worker is: process id, node, slot, runtime (for logs, metrics, tests)."""
        import ray

        return {
            "pid": os.getpid(),
            "node_ip": ray.util.get_node_ip_address(),
            "slot": self.slot.name,
            "device": self.runtime.device,
            "providers": list(self.runtime.providers),
            "threads": self.runtime.intra_op_threads,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "sessions": sorted(f"{Path(p).name}/{q}" for p, q in self._sessions),
        }

    def load(self, path: str, precision: str, spec: Any) -> None:
        """Create the session for ``path`` at ``precision`` unless it is warm already."""
        from radserve.inference.session import ModelSession

        key = (path, precision)
        if key not in self._sessions:
            self._sessions[key] = ModelSession(
                Path(path), spec, runtime=self.runtime, precision=precision
            )

    def run(self, path: str, precision: str, batch: np.ndarray) -> np.ndarray:
        """One batch through a warm session (``load`` must have been called)."""
        session = self._sessions.get((path, precision))
        if session is None:
            raise RayExecutorError(f"worker {self.slot.name}: {path} is not loaded")
        return session.run(batch)

    def release(self, path: str, precision: str) -> None:
        session = self._sessions.get((path, precision))
        if session is not None:
            session.release_memory()


_ACTOR: Any = None


def actor_class() -> Any:
    """``ray.remote(DeviceWorker)``, made once (importing Ray only when asked)."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(DeviceWorker)
    return _ACTOR


__all__ = ["DeviceSlot", "DeviceWorker", "RayExecutorError", "actor_class"]
