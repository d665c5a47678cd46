"""The scheduler work for one job: a DICOM study (the scheduling package's
:class:`~radserve.scheduling.study_work.StudyWork`), a NIfTI volume, and the optional
DICOM SEG/SR stage for studies that came in over DICOM and go back to the PACS.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from radserve.ingest import IngestPolicy, LoadedSeries, PatientInfo, SeriesHeader, load_nifti
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, VolumeRun
from radserve.progress import StageTimer
from radserve.report.dicom import write_dicom_results
from radserve.scheduling import CpuStage, JobWork, Stage
from radserve.scheduling.study_work import StudyWork
from radserve.service.catalog import ResolvedPipeline
from radserve.study import IngestedStudy, StudyResult

logger = logging.getLogger(__name__)

NIFTI_SUFFIXES = (".nii", ".nii.gz")


class NiftiStudyWork(StudyWork):
    """A NIfTI volume through a pipeline: the same stages as a DICOM study, with an
    ingest that reads one NIfTI file. NIfTI carries no modality: the pipeline's first
    accepted modality is assumed (values must be in its physical units, HU for CT)."""

    def _ingest(self) -> None:
        self._started = time.perf_counter()
        self._timer = StageTimer()
        source = self.sources if isinstance(self.sources, Path) else self.sources[0]
        with self._timer.stage("ingest: load"):
            volume = load_nifti(source)
        modality = (self.pipeline.series_selection.modalities or ("CT",))[0]
        header = SeriesHeader(
            series_instance_uid="",
            study_instance_uid="",
            modality=modality,
            series_description="NIfTI upload",
            series_number=None,
            body_part_examined="",
            frame_of_reference_uid=None,
            sop_class_uid="",
            image_type=(),
            slice_thickness=None,
            number_of_instances=1,
            patient=PatientInfo(),
            frames=(),
        )
        self._ingested = IngestedStudy(LoadedSeries(volume, header), [])
        self._run = VolumeRun(
            volume,
            self.pipeline,
            registry=self._registry,
            sessions=self._sessions,
            precision=self._precision,
        )
        self._open_next_step()


class WithDicomResults:
    """``inner``'s stages, then one more: DICOM SEG and SR written into the result folder
    (for studies received over DICOM, whose results go back to the PACS)."""

    def __init__(self, inner: StudyWork, sources: list[Path], *, key_images: bool = False) -> None:
        self.inner = inner
        self.key_images = key_images
        self.sources = sources
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
            result.report, result.out_dir, self.sources, key_images=self.key_images
        )
        self._state = "done"

    def result(self) -> object:
        return self.inner.result()


def input_kind(study_dir: Path) -> str:
    """``nifti`` for a study folder holding one NIfTI file, else ``dicom``."""
    files = [p for p in Path(study_dir).iterdir() if p.is_file()]
    if len(files) == 1 and files[0].name.lower().endswith(NIFTI_SUFFIXES):
        return "nifti"
    return "dicom"


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
) -> JobWork:
    """The work for one stored study (a content-addressed folder)."""
    study_dir = Path(study_dir)
    common = {
        "pipeline": resolved.spec,
        "out_dir": out_dir,
        "registry": registry,
        "sessions": sessions,
        "precision": resolved.precision,
        "policy": policy,
        "job_id": job_id,
    }
    if input_kind(study_dir) == "nifti":
        nifti = next(p for p in study_dir.iterdir() if p.is_file())
        return NiftiStudyWork(nifti, **common)  # type: ignore[arg-type]
    work = StudyWork(study_dir, **common)  # type: ignore[arg-type]
    if dicom_results:
        sources = sorted(p for p in study_dir.iterdir() if p.is_file())
        return WithDicomResults(work, sources, key_images=key_image_scs)
    return work


__all__ = ["NiftiStudyWork", "WithDicomResults", "build_work", "input_kind"]
