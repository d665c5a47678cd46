"""A study through a pipeline, cut into the scheduler's stages (its unit of work).

ingest (CPU pool: the input's ``ingest``) -> for each model: its batches (device,
interleaved with other studies' batches) then post-processing (CPU pool) -> report
files (CPU pool). The pieces are :mod:`radserve.pipeline.study`'s and
:class:`~radserve.pipeline.volume.VolumeRun`'s, so a scheduled study gives the same
report as :func:`~radserve.pipeline.study.run_study`. :class:`StudyWork` implements the
scheduler's :class:`~radserve.scheduling.work.JobWork` protocol; the scheduler knows
nothing of studies.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import Enum
from pathlib import Path

from radserve.inference.runner import release_arena
from radserve.ingest import IngestPolicy
from radserve.models.manifest import Precision
from radserve.models.registry import ModelRegistry
from radserve.pipeline.channels import load_channels
from radserve.pipeline.inputs import IngestedStudy, StudyInput, as_input
from radserve.pipeline.selection import SlicePlanes
from radserve.pipeline.spec import PipelineSpec
from radserve.pipeline.study import StudyResult, finish_study, refuse_outside_domain
from radserve.pipeline.volume import PendingStep, SessionPool, VolumeRun
from radserve.progress import StageTimer
from radserve.scheduling.work import CpuStage, DeviceStage, ModelKey, Stage


class _Phase(Enum):
    INGEST = "ingest"
    DEVICE = "device"
    POSTPROCESS = "postprocess"
    REPORT = "report"
    DONE = "done"


class StudyWork:
    """:class:`~radserve.scheduling.work.JobWork` for one study; ``result()`` is the
    :class:`~radserve.pipeline.study.StudyResult`. Each stage may be re-run after a failure.

    ``source`` is a :class:`~radserve.pipeline.inputs.StudyInput` (DICOM files, a NIfTI
    volume, ...); a path or list of paths means DICOM files.
    """

    def __init__(
        self,
        source: StudyInput | Path | Sequence[Path],
        *,
        pipeline: PipelineSpec,
        out_dir: Path,
        registry: ModelRegistry,
        sessions: SessionPool,
        precision: Precision | None = None,
        policy: IngestPolicy | None = None,
        key_images: bool = True,
        job_id: str | None = None,
        dicom_references: bool = False,
    ) -> None:
        self.source: StudyInput = as_input(source)
        # the results go back as DICOM SEG/SR: a volume whose slices they cannot reference
        # (resampled on ingest, several Enhanced instances, frames of differing orientation)
        # is refused at ingest, before inference
        self._dicom_references = dicom_references
        self.pipeline = pipeline
        self.out_dir = Path(out_dir)
        self._registry, self._sessions = registry, sessions
        self._precision, self._policy = precision, policy
        self._key_images, self._job_id = key_images, job_id
        self._phase = _Phase.INGEST
        self._timer = StageTimer()
        self._started: float | None = None
        self._ingested: IngestedStudy | None = None
        self._run: VolumeRun | None = None
        self._pending: PendingStep | None = None
        self._step_started = 0.0
        self._result: StudyResult | None = None

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(step.model for step in self.pipeline.steps))

    def next_stage(self) -> Stage | None:
        phase = self._phase
        if phase is _Phase.INGEST:
            return CpuStage("ingest", self._ingest)
        if phase is _Phase.DEVICE:
            assert self._pending is not None and self._run is not None
            spec = self._pending.bundle.spec
            self._phase = _Phase.POSTPROCESS
            self._step_started = time.perf_counter()
            key = ModelKey(spec.name, spec.version, self._run.precision)
            return DeviceStage(spec.name, key, self._pending.task, self._pending.session)
        if phase is _Phase.POSTPROCESS:
            assert self._pending is not None
            return CpuStage(f"{self._pending.bundle.spec.name}: postprocess", self._postprocess)
        if phase is _Phase.REPORT:
            return CpuStage("report", self._report)
        return None

    def result(self) -> object:
        return self._result

    # --- stages (CPU pool) --------------------------------------------------------------
    def _ingest(self) -> None:
        self._started = time.perf_counter()
        self._timer = StageTimer()
        self._ingested = self.source.ingest(
            self.pipeline,
            policy=self._policy,
            timer=self._timer,
            planes=SlicePlanes.of_pipeline(self.pipeline, self._registry),
        )
        self._ingested = refuse_outside_domain(
            self._ingested, self.pipeline, self._registry, self._policy
        )
        if self._dicom_references:
            # here only: the DICOM writers load highdicom, which the run path does not
            from radserve.report.dicom.frames import check_loaded_references

            check_loaded_references(self._ingested.loaded)
        self._ingested, channels = load_channels(
            self._ingested, self.pipeline, self._registry, self._policy, self._timer
        )
        self._run = VolumeRun(
            self._ingested.loaded.volume,
            self.pipeline,
            registry=self._registry,
            sessions=self._sessions,
            precision=self._precision,
            channels=channels,
            max_voxels=(self._policy or IngestPolicy()).max_voxels,
        )
        self._open_next_step()

    def _open_next_step(self) -> None:
        """Load the next model's session and build its task (ROI from the organs so far)."""
        assert self._run is not None
        self._pending = self._run.next_step()
        self._phase = _Phase.DEVICE if self._pending is not None else _Phase.REPORT

    def _postprocess(self) -> None:
        assert self._run is not None
        pending = self._pending
        if pending is not None:  # None: a retry after complete_step already ran
            name = pending.bundle.spec.name
            self._timer.seconds[f"{name}: inference"] = time.perf_counter() - self._step_started
            prediction = pending.task.finish(precision=pending.session.precision)
            # As the single-study runners do (ONNX Runtime runs are safe beside the
            # device thread's batches of other studies on the same session).
            release_arena(pending.session)
            self._run.complete_step(prediction)
            self._pending = None
        self._open_next_step()

    def _report(self) -> None:
        assert self._ingested is not None and self._run is not None
        self._result = finish_study(
            self._ingested,
            self._run.result(),
            pipeline=self.pipeline,
            sessions=self._sessions,
            out_dir=self.out_dir,
            timer=self._timer,
            started=self._started,
            key_images=self._key_images,
            job_id=self._job_id,
        )
        self._phase = _Phase.DONE
        self._ingested = self._run = None  # the volume is no longer needed


__all__ = ["StudyWork"]
