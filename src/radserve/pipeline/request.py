"""A study submitted to the scheduler without the service: the bench and tests use it.

:class:`StudyRequest` says what to run (input, pipeline, output folder) and how it is
classified (an explicit priority class, DICOM attributes, or the attributes read from the
study's first file); :meth:`StudyRequest.job` turns it into the scheduler's
:class:`~radserve.scheduling.jobs.JobRequest` over a registry and a session pool. The
server builds its work in :mod:`radserve.service.work` from the same pieces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from radserve.domain.priority import PriorityClass, PriorityRules
from radserve.ingest import IngestPolicy
from radserve.ingest.attributes import read_priority_attributes
from radserve.models.manifest import Precision
from radserve.models.registry import ModelRegistry
from radserve.pipeline.inputs import StudyInput, first_file
from radserve.pipeline.spec import PipelineSpec
from radserve.pipeline.volume import SessionPool
from radserve.pipeline.work import StudyWork
from radserve.scheduling.jobs import JobRequest


@dataclass(frozen=True, kw_only=True)
class StudyRequest:
    """One study for the scheduler.

    Without ``priority`` or ``attributes`` the attributes ``rules`` reads are taken from
    the study's first DICOM file (header only), for the scheduler to classify.
    """

    job_id: str
    source: StudyInput | Path | Sequence[Path]
    pipeline: PipelineSpec
    out_dir: Path
    priority: PriorityClass | None = None
    attributes: Mapping[str, str] | None = None
    rules: PriorityRules | None = None
    precision: Precision | None = None
    policy: IngestPolicy | None = None
    key_images: bool = True
    age_s: float = 0.0
    resume: bool = False

    def job(self, *, registry: ModelRegistry, sessions: SessionPool) -> JobRequest:
        """The scheduler's request: a :class:`StudyWork` and its classification."""
        attributes = dict(self.attributes or {})
        if self.priority is None and self.attributes is None:
            first = first_file(self.source)
            if first is not None:
                keywords = (self.rules if self.rules is not None else PriorityRules()).keywords
                attributes = read_priority_attributes(first, keywords)
        work = StudyWork(
            self.source,
            pipeline=self.pipeline,
            out_dir=self.out_dir,
            registry=registry,
            sessions=sessions,
            precision=self.precision,
            policy=self.policy,
            key_images=self.key_images,
            job_id=self.job_id,
        )
        return JobRequest(
            self.job_id, work, self.priority, attributes, age_s=self.age_s, resume=self.resume
        )


__all__ = ["StudyRequest"]
