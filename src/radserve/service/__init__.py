"""The service: everything a running server is made of, wired together and synchronous.

:class:`Service` is the composition root (store, models, scheduler, executor, intake,
DICOM gateway); the HTTP API (:mod:`radserve.api`) calls it from worker threads.
"""

from radserve.service.catalog import Catalog, ResolvedPipeline
from radserve.service.intake import Intake, Origin, Submission, parse_priority
from radserve.service.jobs import JobAccess, JobView
from radserve.service.service import Readiness, Service

__all__ = [
    "Catalog",
    "Intake",
    "JobAccess",
    "JobView",
    "Origin",
    "Readiness",
    "ResolvedPipeline",
    "Service",
    "Submission",
    "parse_priority",
]
