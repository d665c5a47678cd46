"""Which executor a server runs: worker threads of this process, or Ray actors.

``executor: inprocess`` (the default) needs nothing beyond radserve; ``executor: ray``
imports Ray only here, when asked for, so a server without the ``ray`` extra starts as
before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from radserve.config import Settings
from radserve.scheduling import Executor, InProcessExecutor, Scheduler
from radserve.scheduling.ray_executor import keep_signal_handlers
from radserve.service.catalog import WarmRunner


def make_executor(
    settings: Settings, scheduler: Scheduler, *, device: str, cpu_workers: int
) -> Executor:
    """The executor ``settings.executor`` names, over ``scheduler``."""
    if settings.executor == "inprocess":
        return InProcessExecutor(scheduler, devices=(device,), cpu_workers=cpu_workers)
    from radserve.scheduling.ray_executor import RayExecutor

    ray = settings.ray
    return RayExecutor(
        scheduler,
        devices=ray.devices,
        address=ray.address,
        providers=settings.runtime.providers,
        cpu_workers=cpu_workers,
        num_cpus=ray.num_cpus,
        object_store_bytes=ray.object_store_mb * 1024**2 if ray.object_store_mb else None,
        batch_timeout_s=ray.batch_timeout_s,
        max_restarts=ray.max_restarts,
        startup_timeout_s=ray.startup_timeout_s,
    )


def warm_runner(executor: Executor) -> WarmRunner | None:
    """How warm-up runs a model on ``executor``'s workers, when they hold their own
    sessions (Ray actors); ``None``: the sessions run in this process."""
    from radserve.scheduling.ray_executor import RayExecutor

    return executor.warm_session if isinstance(executor, RayExecutor) else None


def workers_down(executor: Executor) -> dict[str, float]:
    """The device workers lost and not back yet (name -> seconds down): Ray actors only;
    the threads of this process are never lost without the process."""
    from radserve.scheduling.ray_executor import RayExecutor

    return executor.workers_down() if isinstance(executor, RayExecutor) else {}


class RayWorkersCollector(Collector):
    """The Ray executor's workers at scrape: up or not, and what was lost."""

    def __init__(self, executor: Any) -> None:
        self._executor = executor

    def collect(self) -> Iterator[Any]:
        ex = self._executor
        up = GaugeMetricFamily(
            "radserve_ray_worker_up",
            "1 while a Ray device worker answers; 0 from its loss until Ray restarted or "
            "replaced it",
            labels=["worker"],
        )
        down = GaugeMetricFamily(
            "radserve_ray_worker_down_seconds",
            "How long a Ray device worker has been lost (0 while it is up)",
            labels=["worker"],
        )
        lost = CounterMetricFamily(
            "radserve_ray_batches_lost",
            "Batches a Ray device worker lost (it died or hung mid-batch)",
            labels=["worker"],
        )
        gone = ex.workers_down()
        for worker in list(ex.workers):
            name = worker.slot.name
            up.add_metric([name], 0.0 if name in gone else 1.0)
            down.add_metric([name], gone.get(name, 0.0))
            lost.add_metric([name], float(worker.lost))
        yield up
        yield down
        yield lost
        yield CounterMetricFamily(
            "radserve_ray_batches_failed",
            "Batches lost ray_executor.MAX_BATCH_LOSSES times and failed (the study "
            "killed every worker that ran it): each fails its job with batch_lost",
            value=float(ex.failed_batches),
        )
        yield CounterMetricFamily(
            "radserve_ray_workers_replaced",
            "Ray device worker actors created anew after Ray could not restart them",
            value=float(ex.replaced),
        )


def executor_collector(executor: Executor) -> Collector | None:
    """The metrics of ``executor``'s workers, where it has any of its own (Ray)."""
    from radserve.scheduling.ray_executor import RayExecutor

    return RayWorkersCollector(executor) if isinstance(executor, RayExecutor) else None


__all__ = [
    "RayWorkersCollector",
    "executor_collector",
    "keep_signal_handlers",
    "make_executor",
    "warm_runner",
    "workers_down",
]
