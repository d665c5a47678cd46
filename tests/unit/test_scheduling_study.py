"""Studies on disk through the scheduler (ingest on the CPU pool, batches on the device,
reports on the CPU pool) give the same findings as ``run_study``; the class comes from
the study's DICOM attributes when the request does not state it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series
from tests.factories.scheduling_fakes import RecordingHooks

from radserve.checkpoints import PauseLog, yielding_to
from radserve.domain.volume import Volume
from radserve.inference import ModelSession, choose_runtime
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, StudyRequest, VolumeRun
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.pipeline.study import StudyResult, run_study
from radserve.report import read_report
from radserve.scheduling import (
    InProcessExecutor,
    JobState,
    PriorityClass,
    PriorityRules,
    Scheduler,
    run_serial,
)

GRID = {"n_slices": 16, "rows": 48, "cols": 48, "spacing": (2.0, 1.0, 1.0)}


def _hu(centre: tuple[float, float, float]) -> Callable[[np.ndarray], np.ndarray]:
    def hu(points: np.ndarray) -> np.ndarray:
        block = (np.abs(points - np.array([0.0, 0.0, 15.0])) < [18.0, 18.0, 40.0]).all(-1)
        sphere = np.linalg.norm(points - np.array(centre), axis=-1) <= 5.0
        return np.where(sphere, 700.0, np.where(block, 100.0, -1000.0))

    return hu


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRegistry, PipelineSpec, Path]:
    root = tmp_path_factory.mktemp("sched-study")
    registry = ModelRegistry(write_test_bundles(root / "models"))
    return registry, load_pipeline(write_test_pipeline(root, min_slices=3)), root


def test_scheduled_studies_match_run_study(setup, tmp_path: Path, monkeypatch) -> None:
    registry, pipeline, _ = setup
    sessions = SessionPool()
    released: list[str] = []
    shrink = ModelSession.release_memory
    monkeypatch.setattr(
        ModelSession, "release_memory", lambda s: (released.append(s.spec.name), shrink(s))
    )
    centres = {"a": (4.0, -3.0, 12.0), "b": (-5.0, 4.0, 16.0), "stat": (0.0, 0.0, 14.0)}
    for name, centre in centres.items():
        extra = {"RequestedProcedurePriority": "STAT"} if name == "stat" else None
        origin = (-23.5, -23.5, 0.0)
        make_ct_series(tmp_path / name, **GRID, origin=origin, hu=_hu(centre), extra=extra)

    hooks = RecordingHooks()
    scheduler = Scheduler(hooks=hooks)
    executor = InProcessExecutor(scheduler)
    tickets = {}
    executor.start()
    try:
        for name in centres:
            request = StudyRequest(
                job_id=name,
                source=tmp_path / name,
                pipeline=pipeline,
                out_dir=tmp_path / "out" / name,
                rules=PriorityRules(),
            ).job(registry=registry, sessions=sessions)
            tickets[name] = scheduler.submit(request)
        assert executor.wait_idle(60.0)
    finally:
        executor.stop()
    # Each study's two model steps let their session's arena shrink once done.
    assert sorted(released) == sorted(["organs-test", "lesions-test"] * len(centres))
    assert tickets["stat"].cls is PriorityClass.URGENT
    assert tickets["a"].cls is PriorityClass.OUTPATIENT

    for name in centres:
        final = hooks.final(name)
        assert final is not None and final.state is JobState.SUCCEEDED, final
        scheduled = final.result
        assert isinstance(scheduled, StudyResult)
        reference = run_study(
            tmp_path / name,
            pipeline=pipeline,
            out_dir=tmp_path / "ref" / name,
            registry=registry,
            sessions=sessions,
        )
        got, want = scheduled.report, reference.report
        assert len(got.findings) == len(want.findings) == 1
        np.testing.assert_allclose(got.findings[0].centroid_mm, want.findings[0].centroid_mm)
        np.testing.assert_allclose(got.findings[0].centroid_mm, centres[name], atol=1.5)
        assert got.findings[0].volume_ml == pytest.approx(want.findings[0].volume_ml)
        assert got.job_id == name
        assert {"ingest: load", "organs-test: inference", "report", "total"} <= set(got.timings)
        assert (scheduled.out_dir / "findings.nii.gz").is_file()
        assert {"ingest", "organs-test: infer", "lesions-test: postprocess"} <= set(final.timings)


def test_a_stage_paused_for_urgent_work_says_so_in_the_report(setup, tmp_path: Path) -> None:
    """Waits at a routine study's checkpoints (here 10 ms each, as while an URGENT study
    runs) show in its report as ``paused``, each inside its stage's timing and counted
    once; a run that never waited has none."""
    registry, pipeline, _ = setup
    make_ct_series(tmp_path / "s", **GRID, origin=(-23.5, -23.5, 0.0), hu=_hu((0.0, 0.0, 14.0)))
    sessions, log = SessionPool(), PauseLog()

    def run(out: str) -> StudyResult:
        return run_study(
            tmp_path / "s", pipeline=pipeline, out_dir=tmp_path / out,
            registry=registry, sessions=sessions,
        )  # fmt: skip

    with yielding_to(lambda: time.sleep(0.01), log):
        paused = run("paused")
    calm = run("calm")
    report = read_report(paused.report_path)
    assert calm.report.paused == {}
    assert report.paused == paused.report.paused
    assert {"ingest: discover", "report"} <= set(report.paused)
    for stage, seconds in report.paused.items():
        assert 0.01 <= seconds <= report.timings[stage], stage
    assert sum(report.paused.values()) <= log.within() + 1e-3  # rounded to 0.1 ms each
    assert [f.centroid_mm for f in report.findings] == [f.centroid_mm for f in calm.report.findings]


def test_a_study_that_cannot_be_read_fails_with_its_code(setup, tmp_path: Path) -> None:
    registry, pipeline, _ = setup
    (tmp_path / "empty").mkdir()
    hooks = RecordingHooks()
    scheduler = Scheduler(hooks=hooks)
    request = StudyRequest(
        job_id="empty",
        source=tmp_path / "empty",
        pipeline=pipeline,
        out_dir=tmp_path / "out",
        priority=PriorityClass.INPATIENT,
    ).job(registry=registry, sessions=SessionPool())
    scheduler.submit(request)
    run_serial(scheduler)
    final = hooks.final("empty")
    assert final is not None and final.state is JobState.FAILED
    assert final.error_code not in (None, "internal_error")


def test_pipeline_steps_batch_as_the_device_allows(setup) -> None:
    """model.yaml's batch size is a ceiling; on a CPU device the runtime caps it."""
    registry, pipeline, _ = setup
    sessions = SessionPool(choose_runtime(prefer=["CPUExecutionProvider"], threads=1))
    ct = Volume.from_geometry(np.full((16, 48, 48), 100, np.int16), spacing=(2.0, 1.0, 1.0))
    run = VolumeRun(ct, pipeline, registry=registry, sessions=sessions)
    pending = run.next_step()
    assert pending is not None
    assert pending.bundle.spec.input.batch_size > 2
    assert pending.task.batch_size == sessions.runtime.max_batch_size == 2
