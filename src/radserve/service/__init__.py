"""The service: everything a running server is made of, wired together and synchronous.

:class:`Service` is the composition root (store, models, scheduler, executor, intake,
DICOM gateway); the HTTP API (:mod:`radserve.api`) calls it from worker threads.

The names below are imported on first use, not with the package: a module of this
package (``radserve.service.logs``, ``.jobs``) imported on its own, as the API's reader
and audit writer processes do in their spawned interpreters, used to import the whole
service with it (the inference runtimes, pydicom, SciPy: ~240 MiB RSS a process).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radserve.service.catalog import Catalog, ResolvedPipeline
    from radserve.service.intake import Intake, Origin, Submission, parse_priority
    from radserve.service.jobs import JobAccess, JobView
    from radserve.service.service import Readiness, Service

_WHERE = {
    "Catalog": "catalog",
    "ResolvedPipeline": "catalog",
    "Intake": "intake",
    "Origin": "intake",
    "Submission": "intake",
    "parse_priority": "intake",
    "JobAccess": "jobs",
    "JobView": "jobs",
    "Readiness": "service",
    "Service": "service",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


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
