"""Scheduler settings: one frozen, validated object, built once and passed in.

The service builds it from its own settings (env prefix ``RADSERVE_``); unknown keys are
errors so a misspelt TAT never silently falls back to a default.
"""

from __future__ import annotations

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from radserve.scheduling.priority import PriorityClass, PriorityRules

_DEFAULT_TAT_S = {
    PriorityClass.URGENT: 60.0,
    PriorityClass.INPATIENT: 300.0,
    PriorityClass.OUTPATIENT: 1800.0,
}


def _by_class(value: object) -> object:
    """Accept class names as keys ("outpatient": 200) as well as enum members."""
    if isinstance(value, dict):
        return {
            PriorityClass.parse(k) if isinstance(k, str) else PriorityClass(k): v
            for k, v in value.items()
        }
    return value


class SchedulerConfig(BaseModel):
    """Everything the scheduler core decides with; times in seconds.

    URGENT's TAT is "start at once": the ranking and ``urgent_exclusive`` do that.
    ``tat_s[URGENT]`` is the *completion* target its deadline is set from, used only to
    account misses (60 s by default: an emergency CT read by AI within a minute).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Classes left out keep their default TAT.
    tat_s: dict[PriorityClass, float] = Field(default_factory=lambda: dict(_DEFAULT_TAT_S))
    # Waiting (not yet started) jobs per class beyond which submissions are refused.
    # URGENT has no limit and cannot be given one.
    queue_limits: dict[PriorityClass, int] = Field(
        default_factory=lambda: {PriorityClass.INPATIENT: 200, PriorityClass.OUTPATIENT: 500}
    )
    # A routine job is promoted one class once its slack < aging_fraction x its TAT.
    aging_fraction: float = Field(default=0.25, ge=0.0, le=1.0)
    # While an URGENT job is unfinished, start no work of other classes (devices and
    # CPU pool). Right for CPU-bound hosts, where any routine batch competes with the
    # emergency for the same cores; with several GPUs it may be turned off.
    urgent_exclusive: bool = True
    # Jobs holding a loaded volume at once (URGENT may exceed it): bounds memory.
    max_running: int = Field(default=4, ge=1)
    # Dynamic batching: items per device call, and how long a routine batch may wait
    # for a compatible batch that is being prepared. URGENT batches never wait.
    max_batch_size: int = Field(default=32, ge=1)
    max_queue_delay_s: float = Field(default=0.005, ge=0.0)
    # Batches prepared ahead per job, and in total, while the device is busy.
    lookahead_batches: int = Field(default=2, ge=1)
    max_prepared_batches: int = Field(default=6, ge=1)
    # Failures: retries per job for retryable errors, job timeout from its start,
    # consecutive device failures that open a model's circuit breaker.
    max_retries: int = Field(default=2, ge=0)
    job_timeout_s: float = Field(default=900.0, gt=0.0)
    breaker_threshold: int = Field(default=3, ge=1)
    # Retry-After when no job has finished yet to estimate from.
    default_retry_after_s: int = Field(default=30, ge=1)
    rules: PriorityRules = Field(default_factory=PriorityRules)

    @field_validator("tat_s", "queue_limits", mode="before")
    @classmethod
    def _class_keys(cls, value: object, info: ValidationInfo) -> object:
        value = _by_class(value)
        if info.field_name == "tat_s" and isinstance(value, dict):
            return {**_DEFAULT_TAT_S, **value}
        return value

    @model_validator(mode="after")
    def _check(self) -> SchedulerConfig:
        if any(v < 0 for v in self.tat_s.values()):
            raise ValueError("TATs must be >= 0 seconds")
        if PriorityClass.URGENT in self.queue_limits:
            raise ValueError("URGENT work is never refused: remove its queue limit")
        if any(v < 0 for v in self.queue_limits.values()):
            raise ValueError("queue limits must be >= 0")
        return self

    def tat(self, cls: PriorityClass) -> float:
        return self.tat_s[cls]

    def queue_limit(self, cls: PriorityClass) -> int | None:
        return None if cls is PriorityClass.URGENT else self.queue_limits.get(cls)


__all__ = ["SchedulerConfig"]
