"""From the server's settings (:mod:`radserve.config`) to the scheduler's own shapes.

The scheduler was written against its own :class:`~radserve.scheduling.SchedulerConfig`
(an IntEnum of classes, ``equals``/``matches``/``present`` rules); the settings file
speaks in class names, per-class sections and ``values`` lists. This is the one place
that translates between them.

URGENT's TAT in the settings is 0 ("start at once"). The scheduler starts URGENT work at
once anyway (ranking, exclusive lane); its URGENT TAT is the *completion* target a
deadline miss is counted against, so a 0 keeps the scheduler's default target instead
of making every emergency late on arrival.
"""

from __future__ import annotations

from radserve.config import PriorityClass as SettingsClass
from radserve.config import Settings
from radserve.scheduling import PriorityClass, PriorityRule, PriorityRules, SchedulerConfig


def to_scheduler_class(value: SettingsClass | str) -> PriorityClass:
    """``"URGENT"`` (the store's and API's spelling) -> the scheduler's enum."""
    return PriorityClass.parse(str(value))


def to_settings_class(value: PriorityClass) -> SettingsClass:
    """The scheduler's enum -> the spelling the store and the API carry."""
    return SettingsClass(value.name)


def priority_rules(settings: Settings) -> PriorityRules:
    """``settings.priority_rules`` (attribute, values, class) as scheduler rules."""
    return PriorityRules(
        rules=tuple(
            PriorityRule(
                attribute=rule.attribute,
                equals=tuple(rule.values),
                priority=to_scheduler_class(rule.priority_class),
            )
            for rule in settings.priority_rules
        ),
        default=PriorityClass.OUTPATIENT,
    )


def scheduler_config(settings: Settings, device_max_batch: int | None = None) -> SchedulerConfig:
    """The scheduler's configuration for these settings.

    ``device_max_batch`` (:attr:`RuntimeChoice.max_batch_size`) caps dynamic batching
    too: on a CPU device, merging several studies' batches into one call is no faster
    and its activations grow with it.
    """
    sched = settings.scheduler
    max_batch = sched.max_batch_size
    if device_max_batch is not None:
        max_batch = min(max_batch, device_max_batch)
    tat = {
        PriorityClass.INPATIENT: sched.tat_s.inpatient,
        PriorityClass.OUTPATIENT: sched.tat_s.outpatient,
    }
    if sched.tat_s.urgent > 0:
        tat[PriorityClass.URGENT] = sched.tat_s.urgent
    limits = {
        to_scheduler_class(cls): limit
        for cls in (SettingsClass.INPATIENT, SettingsClass.OUTPATIENT)
        if (limit := sched.queue_limits.for_class(cls)) is not None
    }
    return SchedulerConfig(
        tat_s=tat,
        queue_limits=limits,
        aging_fraction=sched.aging_fraction,
        max_batch_size=max_batch,
        max_queue_delay_s=sched.max_queue_delay_ms / 1000.0,
        breaker_threshold=sched.breaker_threshold,
        max_retries=settings.jobs.max_retries,
        job_timeout_s=settings.jobs.timeout_s,
        rules=priority_rules(settings),
    )


__all__ = ["priority_rules", "scheduler_config", "to_scheduler_class", "to_settings_class"]
