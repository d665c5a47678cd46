"""Clinical-priority scheduling: which batch of which study runs next, on which device.

Independent of HTTP and of the database: the service submits :class:`JobRequest`\\ s to
a :class:`Scheduler`, runs an :class:`InProcessExecutor` over it, and learns what
happened through the :class:`JobHooks` it implements. It dispatches :class:`JobWork`
(stages: CPU callables and device batches) and knows nothing of studies: the study's
work is :class:`radserve.pipeline.StudyWork`.
"""

from radserve.domain.priority import PriorityClass, PriorityRule, PriorityRules
from radserve.scheduling.clock import Clock, FakeClock, MonotonicClock
from radserve.scheduling.core import Scheduler
from radserve.scheduling.dispatch import (
    BatchDispatch,
    Dispatch,
    DispatchOutcome,
    MergeDispatch,
    PrepareDispatch,
    StageDispatch,
    execute,
)
from radserve.scheduling.errors import (
    DuplicateJobError,
    JobCancelledError,
    JobTimeoutError,
    ModelUnavailableError,
    NotWaitingError,
    QueueFullError,
    SchedulingError,
)
from radserve.scheduling.executor import Executor, InProcessExecutor, run_serial
from radserve.scheduling.jobs import (
    BatchEvent,
    DeadlineMiss,
    Hold,
    JobEvent,
    JobHooks,
    JobInfo,
    JobRequest,
    JobState,
    JobTicket,
    NullHooks,
    QueuedJob,
    Reprioritised,
    SchedulerSnapshot,
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
    "DispatchOutcome",
    "DuplicateJobError",
    "Executor",
    "FakeClock",
    "Hold",
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
    "NotWaitingError",
    "NullHooks",
    "PrepareDispatch",
    "PriorityClass",
    "PriorityRule",
    "PriorityRules",
    "QueueFullError",
    "QueuedJob",
    "Reprioritised",
    "Scheduler",
    "SchedulerSnapshot",
    "SchedulingError",
    "Stage",
    "StageDispatch",
    "execute",
    "run_serial",
]
