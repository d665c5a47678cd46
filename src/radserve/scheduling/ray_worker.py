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
from pathlib import Path
from typing import Any

import numpy as np

from radserve.domain.device_slot import DeviceSlot
from radserve.errors import RadserveError


class RayExecutorError(RadserveError):
    """The Ray executor cannot start or lost its cluster (not a study's fault)."""

    code = "ray_executor_failed"


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
