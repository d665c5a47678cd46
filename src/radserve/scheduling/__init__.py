"""Clinical-priority scheduling: which batch of which study runs next, on which device.

Independent of HTTP and of the database: the service submits :class:`JobRequest`\\ s to
a :class:`Scheduler`, runs an :class:`InProcessExecutor` over it, and learns what
happened through the :class:`JobHooks` it implements. :class:`StudyWork` turns a study
on disk into the scheduler's stages (ingest, model batches, report).
"""

from radserve.scheduling.clock import Clock, FakeClock, MonotonicClock
from radserve.scheduling.config import SchedulerConfig
from radserve.scheduling.core import Scheduler
from radserve.scheduling.dispatch import (
    BatchDispatch,
    Dispatch,
    MergeDispatch,
    Outcome,
    PrepareDispatch,
    StageDispatch,
    execute,
)
from radserve.scheduling.errors import (
    DuplicateJobError,
    JobCancelledError,
    JobTimeoutError,
    ModelUnavailableError,
    QueueFullError,
    SchedulingError,
)
from radserve.scheduling.executor import Executor, InProcessExecutor, run_serial
from radserve.scheduling.jobs import (
    BatchEvent,
    DeadlineMiss,
    JobEvent,
    JobHooks,
    JobInfo,
    JobRequest,
    JobState,
    JobTicket,
    NullHooks,
    SchedulerSnapshot,
)
from radserve.scheduling.priority import (
    PriorityClass,
    PriorityRule,
    PriorityRules,
    priority_attributes,
    read_priority_attributes,
)
from radserve.scheduling.work import CpuStage, DeviceStage, JobWork, ModelKey, Stage

__all__ = [
    "BatchDispatch",
    "BatchEvent",
    "Clock",
    "CpuStage",
    "DeadlineMiss",
    "DeviceStage",
    "Dispatch",
    "DuplicateJobError",
    "Executor",
    "FakeClock",
    "InProcessExecutor",
    "JobCancelledError",
    "JobEvent",
    "JobHooks",
    "JobInfo",
    "JobRequest",
    "JobState",
    "JobTicket",
    "JobTimeoutError",
    "JobWork",
    "MergeDispatch",
    "ModelKey",
    "ModelUnavailableError",
    "MonotonicClock",
    "NullHooks",
    "Outcome",
    "PrepareDispatch",
    "PriorityClass",
    "PriorityRule",
    "PriorityRules",
    "QueueFullError",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerSnapshot",
    "SchedulingError",
    "Stage",
    "StageDispatch",
    "execute",
    "priority_attributes",
    "read_priority_attributes",
    "run_serial",
]
