"""Which executor a server runs: worker threads of this process, or Ray actors.

``executor: inprocess`` (the default) needs nothing beyond radserve; ``executor: ray``
imports Ray only here, when asked for, so a server without the ``ray`` extra starts as
before.
"""

from __future__ import annotations

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


__all__ = ["keep_signal_handlers", "make_executor", "warm_runner"]
