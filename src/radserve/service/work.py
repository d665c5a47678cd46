"""The scheduler work for one stored job: :class:`~radserve.pipeline.work.StudyWork` over
the study's input (DICOM files or a NIfTI volume), then the service's own stages (the
result's lineage, DICOM SEG/SR for studies that came in over DICOM and go back to the
PACS).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radserve.ingest import IngestPolicy
from radserve.models.registry import ModelRegistry
from radserve.pipeline.inputs import DicomInput, NiftiInput, StudyInput
from radserve.pipeline.study import StudyResult
from radserve.pipeline.volume import SessionPool
from radserve.pipeline.work import StudyWork
from radserve.report.dicom import write_dicom_results
from radserve.scheduling import CpuStage, JobWork, Stage
from radserve.service.catalog import ResolvedPipeline
from radserve.service.failover import SharedStorage, WithPublish
from radserve.service.sniff import input_kind

logger = logging.getLogger(__name__)


LineageStep = Callable[[str, StudyResult], StudyResult]


class WithLineage:
    """``inner``'s stages, then one more: the result's generation among the study's
    results (see :mod:`radserve.service.lineage`), written into its report before any
    DICOM result or FHIR Bundle is made from it."""

    def __init__(self, inner: Any, job_id: str, step: LineageStep) -> None:
        self.inner = inner
        self.job_id = job_id
        self.step = step
        self._result: StudyResult | None = None
        self._state = "inner"

    @property
    def models(self) -> tuple[str, ...]:
        return self.inner.models  # type: ignore[no-any-return]

    def next_stage(self) -> Stage | None:
        if self._state == "inner":
            stage = self.inner.next_stage()
            if stage is not None:
                return stage
            self._state = "lineage"
            return CpuStage("result lineage", self._assign)
        return None

    def _assign(self) -> None:
        result = self.inner.result()
        assert isinstance(result, StudyResult)
        self._result = self.step(self.job_id, result)
        self._state = "done"

    def result(self) -> object:
        return self._result if self._result is not None else self.inner.result()


class WithDicomResults:
    """``inner``'s stages, then one more: DICOM SEG and SR written into the result folder
    (for studies received over DICOM, whose results go back to the PACS)."""

    def __init__(
        self,
        inner: Any,
        sources: list[Path],
        *,
        key_images: bool = False,
        policy: IngestPolicy | None = None,
    ) -> None:
        self.inner = inner
        self.key_images = key_images
        self.sources = sources
        self.policy = policy
        self.written: list[Path] = []
        self._state = "inner"

    @property
    def models(self) -> tuple[str, ...]:
        return self.inner.models

    def next_stage(self) -> Stage | None:
        if self._state == "inner":
            stage = self.inner.next_stage()
            if stage is not None:
                return stage
            self._state = "dicom"
            return CpuStage("dicom results", self._write)
        return None

    def _write(self) -> None:
        result = self.inner.result()
        assert isinstance(result, StudyResult)
        self.written = write_dicom_results(
            result.report,
            result.out_dir,
            self.sources,
            key_images=self.key_images,
            policy=self.policy,
        )
        self._state = "done"

    def result(self) -> object:
        return self.inner.result()


def build_work(
    *,
    job_id: str,
    study_dir: Path,
    resolved: ResolvedPipeline,
    out_dir: Path,
    registry: ModelRegistry,
    sessions: SessionPool,
    policy: IngestPolicy | None,
    dicom_results: bool = False,
    key_image_scs: bool = False,
    lineage: LineageStep | None = None,
    publish: SharedStorage | None = None,
) -> JobWork:
    """The work for one stored study (a content-addressed folder); with ``publish`` its
    result folder, written locally, is published into the data folder at the end."""
    study_dir = Path(study_dir)
    source: StudyInput
    if input_kind(study_dir) == "nifti":
        source = NiftiInput(next(p for p in study_dir.iterdir() if p.is_file()))
    else:
        source = DicomInput(study_dir)
    work: Any = StudyWork(
        source,
        pipeline=resolved.spec,
        out_dir=out_dir,
        registry=registry,
        sessions=sessions,
        precision=resolved.precision,
        policy=policy,
        job_id=job_id,
        dicom_references=dicom_results and not isinstance(source, NiftiInput),
    )
    if not isinstance(source, NiftiInput):
        if lineage is not None:
            work = WithLineage(work, job_id, lineage)
        if dicom_results:
            sources = sorted(p for p in study_dir.iterdir() if p.is_file())
            work = WithDicomResults(work, sources, key_images=key_image_scs, policy=policy)
    if publish is not None:
        work = WithPublish(work, publish)
    return work  # type: ignore[no-any-return]


__all__ = ["WithDicomResults", "WithLineage", "build_work"]
