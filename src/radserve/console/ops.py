"""The operations page's figures, read from the server's own metrics registry and
scheduler, plus a short history sampled while the server runs.

``OpsHistory`` samples every ``SAMPLE_S`` seconds (started with the first console
request after start-up, then kept running): queue depth per class, turnaround (mean
of the jobs finished in the interval, from the ``radserve_job_turnaround_seconds``
histogram), deadline misses, device utilisation and mean batch size per model. It keeps
the last ``KEEP`` samples (one hour) in memory; it is not persisted.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from typing import Any

from radserve.service import Service

SAMPLE_S = 5.0
KEEP = 720


def _samples(service: Service) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric sample name -> [(labels, value)] from the service's registry."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in service.metrics.registry.collect():
        if family.name.startswith("process_"):
            continue
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def _by(samples: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    result: dict[str, float] = {}
    for labels, value in samples:
        key = labels.get(label, "")
        result[key] = result.get(key, 0.0) + value
    return result


def current(service: Service) -> dict[str, Any]:
    """What the page shows now (cumulative counters included)."""
    s = _samples(service)
    tat_sum = _by(s.get("radserve_job_turnaround_seconds_sum", []), "cls")
    tat_count = _by(s.get("radserve_job_turnaround_seconds_count", []), "cls")
    batch_sum = _by(s.get("radserve_batch_size_sum", []), "model")
    batch_count = _by(s.get("radserve_batch_size_count", []), "model")
    return {
        "at": time.time(),
        "queue_depth": _by(s.get("radserve_queue_depth", []), "cls"),
        "running": _by(s.get("radserve_jobs_running", []), "cls"),
        "tat_sum": tat_sum,
        "tat_count": tat_count,
        "tat_mean": {c: tat_sum[c] / n for c, n in tat_count.items() if n},
        "deadline_misses": _by(s.get("radserve_deadline_misses_total", []), "cls"),
        "device_utilization": _by(s.get("radserve_device_utilization_ratio", []), "device"),
        "device_memory_used": _by(s.get("radserve_device_memory_used_bytes", []), "device"),
        "device_memory_total": _by(s.get("radserve_device_memory_total_bytes", []), "device"),
        "batch_sum": batch_sum,
        "batch_count": batch_count,
        "batch_mean": {m: batch_sum[m] / n for m, n in batch_count.items() if n},
        "open_models": [
            k for k, v in _by(s.get("radserve_model_breaker_open", []), "model").items() if v
        ],
    }


def _interval(prev: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """One history point: levels now, rates over the interval since ``prev``."""

    def mean_over(total: str, count: str) -> dict[str, float]:
        out = {}
        for key, n in now[count].items():
            dn = n - prev[count].get(key, 0.0)
            if dn > 0:
                out[key] = (now[total][key] - prev[total].get(key, 0.0)) / dn
        return out

    return {
        "at": now["at"],
        "queue_depth": now["queue_depth"],
        "running": now["running"],
        "tat_mean": mean_over("tat_sum", "tat_count"),
        "finished": {k: v - prev["tat_count"].get(k, 0.0) for k, v in now["tat_count"].items()},
        "deadline_misses": {
            k: v - prev["deadline_misses"].get(k, 0.0) for k, v in now["deadline_misses"].items()
        },
        "device_utilization": now["device_utilization"],
        "batch_mean": mean_over("batch_sum", "batch_count"),
    }


class OpsHistory:
    def __init__(self, service: Service, keep: int = KEEP) -> None:
        self.service = service
        self.points: deque[dict[str, Any]] = deque(maxlen=keep)
        self._last: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()

    def sample(self) -> None:
        now = current(self.service)
        with self._lock:
            if self._last is not None:
                self.points.append(_interval(self._last, now))
            self._last = now

    def ensure_running(self) -> None:
        """Start the sampler on the running loop (once)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        from starlette.concurrency import run_in_threadpool

        while True:
            with contextlib.suppress(Exception):  # a failed scrape skips one point
                await run_in_threadpool(self.sample)
            await asyncio.sleep(SAMPLE_S)

    def history(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.points)


__all__ = ["OpsHistory", "current"]
