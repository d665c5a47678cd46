"""What happens to a study: the run path, top to bottom, in one package.

A study arrives as a :class:`~radserve.pipeline.inputs.StudyInput` (DICOM files or a
NIfTI volume) and a :class:`~radserve.pipeline.spec.PipelineSpec` (``pipelines/*.yaml``).
The server, the CLI and the bench then call, in this order:

1. ``input.ingest`` (:mod:`.inputs`, CPU): discover the series, pick one by the
   pipeline's selection rules (:mod:`.selection`), load it as a Volume;
2. for each model step, :class:`VolumeRun` (:mod:`.volume`): ``next_step`` builds the
   step's batch task, the device runs its batches, ``complete_step`` post-processes the
   prediction (the next step's ROI comes from it);
3. :func:`finish_study` (:mod:`.study`, CPU): label maps, key images, ``report.json``.

:func:`run_study` does all three on the calling thread (``radserve run``);
:class:`StudyWork` (:mod:`.work`) cuts them into the scheduler's stages (``radserve
serve``), and :class:`StudyRequest` (:mod:`.request`) submits one study to a scheduler
without the service (bench, tests). Delivery (SEG/SR, FHIR, outbox) happens after this
package, in :mod:`radserve.service`.

The names below are imported on first use (PEP 562), so reading a pipeline's YAML
(:mod:`.spec`) does not load the report writers or the scheduler's protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radserve.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from radserve.pipeline.inputs import (
        DicomInput,
        IngestedStudy,
        NiftiInput,
        StudyInput,
        as_input,
        ingest_study,
    )
    from radserve.pipeline.request import StudyRequest
    from radserve.pipeline.selection import rejection_reason, select_series
    from radserve.pipeline.spec import (
        PipelineSpec,
        SeriesRules,
        Step,
        available_pipelines,
        bundled_pipeline_dir,
        load_pipeline,
    )
    from radserve.pipeline.study import StudyResult, finish_study, run_study
    from radserve.pipeline.volume import (
        PendingStep,
        SessionPool,
        StepResult,
        VolumeResult,
        VolumeRun,
        release_free_memory,
        run_volume,
    )
    from radserve.pipeline.work import StudyWork

_EXPORTS = {
    "DicomInput": "inputs",
    "IngestedStudy": "inputs",
    "NiftiInput": "inputs",
    "PendingStep": "volume",
    "PipelineSpec": "spec",
    "SeriesRules": "spec",
    "SessionPool": "volume",
    "Step": "spec",
    "StepResult": "volume",
    "StudyInput": "inputs",
    "StudyRequest": "request",
    "StudyResult": "study",
    "StudyWork": "work",
    "VolumeResult": "volume",
    "VolumeRun": "volume",
    "as_input": "inputs",
    "available_pipelines": "spec",
    "bundled_pipeline_dir": "spec",
    "finish_study": "study",
    "ingest_study": "inputs",
    "load_pipeline": "spec",
    "rejection_reason": "selection",
    "release_free_memory": "volume",
    "run_study": "study",
    "run_volume": "volume",
    "select_series": "selection",
}

__all__ = [
    "DicomInput",
    "IngestedStudy",
    "NiftiInput",
    "PendingStep",
    "PipelineSpec",
    "SeriesRules",
    "SessionPool",
    "Step",
    "StepResult",
    "StudyInput",
    "StudyRequest",
    "StudyResult",
    "StudyWork",
    "VolumeResult",
    "VolumeRun",
    "as_input",
    "available_pipelines",
    "bundled_pipeline_dir",
    "finish_study",
    "ingest_study",
    "load_pipeline",
    "rejection_reason",
    "release_free_memory",
    "run_study",
    "run_volume",
    "select_series",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
