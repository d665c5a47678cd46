"""A preferred series in another plane than the pipeline's slice models read gives way to
the next qualifying series in their plane, and the report says why.

Probe (session 37): a study whose only ORIGINAL series is coronal, beside an axial
DERIVED reformat of the same volume, failed ``orientation_unsupported`` on the 2D/2.5D
models (axial) although the axial series was there: selection preferred the ORIGINAL
series and never tried another, where a preferred series that cannot be loaded gives
way to the next (session 36). Real studies written with pydicom, run through
``run_study`` and through the scheduler's StudyWork with the test bundles (a 2D organ
model and a 2.5D lesion model, both reading axial slices by default)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import AXIAL, CORONAL, SAGITTAL, make_ct_series, new_uid
from tests.factories.scheduling_fakes import RecordingHooks

from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, StudyRequest
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.pipeline.study import run_study
from radserve.preprocess.axes import OrientationError
from radserve.report import read_report
from radserve.report.schema import Report
from radserve.scheduling import JobState, PriorityClass, Scheduler, run_serial

DERIVED = ("DERIVED", "SECONDARY", "AXIAL")
PASSED_OVER = (
    "preferred, but its slices are coronal, and model organs-test/1.0.0 reads axial slices "
    "(orientation_unsupported)"
)


def _hu(points: np.ndarray) -> np.ndarray:
    """A 100 HU block with a 700 HU sphere (radius 5 mm), in air: the same patient for
    every series, whatever its plane."""
    block = (np.abs(points - np.array([0.0, 0.0, 15.0])) < [18.0, 18.0, 14.0]).all(-1)
    sphere = np.linalg.norm(points - np.array([4.0, -3.0, 14.0]), axis=-1) <= 5.0
    return np.where(sphere, 700.0, np.where(block, 100.0, -1000.0))


def _axial(folder: Path, study: str, **options: object) -> None:
    """Axial slices 2 mm apart, 1 mm pixels: x, y -23.5..23.5 mm, z 0..30 mm."""
    make_ct_series(
        folder, n_slices=16, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-23.5, -23.5, 0.0), orientation=AXIAL, hu=_hu, study_uid=study, **options,
    )  # fmt: skip


def _coronal(folder: Path, study: str, **options: object) -> None:
    """Coronal slices 1 mm apart (thinner: preferred by ``thinnest`` too) over the same
    box: rows run towards the feet from z = 30 mm, slices towards posterior."""
    make_ct_series(
        folder, n_slices=48, rows=31, cols=48, spacing=(1.0, 1.0, 1.0),
        origin=(-23.5, -23.5, 30.0), orientation=CORONAL, hu=_hu, study_uid=study, **options,
    )  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRegistry, PipelineSpec]:
    root = tmp_path_factory.mktemp("plane-fallback")
    registry = ModelRegistry(write_test_bundles(root / "models"))
    return registry, load_pipeline(write_test_pipeline(root, min_slices=3))


def _run(setup: tuple[ModelRegistry, PipelineSpec], study: Path, out: Path) -> Report:
    registry, pipeline = setup
    return run_study(study, pipeline=pipeline, out_dir=out, registry=registry).report


def _coronal_original_and_axial_derived(folder: Path) -> None:
    study = new_uid()
    _coronal(folder / "coronal", study, series_number=1)
    _axial(folder / "axial", study, series_number=2, image_type=DERIVED)


def _says_the_coronal_series_was_passed_over(report: Report) -> None:
    assert report.series_selection.selected.series_number == 2
    assert [(r.series_number, r.reason) for r in report.series_selection.rejected] == [
        (1, PASSED_OVER)
    ]
    (said,) = [w for w in report.warnings if "was passed over" in w.message]
    assert (said.code, said.stage) == ("ingest", "ingest")
    assert said.message == (
        "series 1 (48 images), preferred (thinnest), was passed over: "
        "[orientation_unsupported] its slices are coronal, and model organs-test/1.0.0 "
        "reads axial slices; series 2 (16 images) was analysed instead"
    )


def test_a_coronal_original_series_gives_way_to_an_axial_derived_one(
    setup: tuple[ModelRegistry, PipelineSpec], tmp_path: Path
) -> None:
    _coronal_original_and_axial_derived(tmp_path / "study")
    report = _run(setup, tmp_path / "study", tmp_path / "out")
    _says_the_coronal_series_was_passed_over(report)
    # the same answer as the axial series alone
    _axial(tmp_path / "alone", new_uid(), series_number=2, image_type=DERIVED)
    alone = _run(setup, tmp_path / "alone", tmp_path / "out-alone")
    assert report.findings and len(report.findings) == len(alone.findings)
    for got, want in zip(report.findings, alone.findings, strict=True):
        np.testing.assert_allclose(got.centroid_mm, want.centroid_mm)
    assert [(m.label, m.volume_ml) for m in report.organ_measurements] == [
        (m.label, m.volume_ml) for m in alone.organ_measurements
    ]


def test_the_scheduler_passes_it_over_too(
    setup: tuple[ModelRegistry, PipelineSpec], tmp_path: Path
) -> None:
    registry, pipeline = setup
    _coronal_original_and_axial_derived(tmp_path / "study")
    hooks = RecordingHooks()
    scheduler = Scheduler(hooks=hooks)
    scheduler.submit(
        StudyRequest(
            job_id="planes",
            source=tmp_path / "study",
            pipeline=pipeline,
            out_dir=tmp_path / "out",
            priority=PriorityClass.INPATIENT,
        ).job(registry=registry, sessions=SessionPool())
    )
    run_serial(scheduler)
    final = hooks.final("planes")
    assert final is not None and final.state is JobState.SUCCEEDED, final
    _says_the_coronal_series_was_passed_over(read_report(tmp_path / "out" / "report.json"))


def test_with_no_series_in_the_models_plane_the_study_fails_orientation_unsupported(
    setup: tuple[ModelRegistry, PipelineSpec], tmp_path: Path
) -> None:
    study = new_uid()
    _coronal(tmp_path / "study" / "coronal", study, series_number=1)
    make_ct_series(
        tmp_path / "study" / "sagittal", n_slices=48, rows=31, cols=48, spacing=(1.0, 1.0, 1.0),
        origin=(-23.5, -23.5, 30.0), orientation=SAGITTAL, hu=_hu, study_uid=study,
        series_number=3, image_type=DERIVED,
    )  # fmt: skip
    with pytest.raises(OrientationError, match=r"slices are coronal, and model .* reads axial"):
        _run(setup, tmp_path / "study", tmp_path / "out")
    assert OrientationError.code == "orientation_unsupported"


def test_a_model_that_reads_slices_as_stored_keeps_the_preferred_series(
    tmp_path: Path,
) -> None:
    """``input.axes: [z, y, x]``: the network takes any plane as stored, so nothing is
    passed over for its plane."""
    models = write_test_bundles(tmp_path / "models")
    for manifest in models.glob("*/1.0.0/model.yaml"):
        spec = yaml.safe_load(manifest.read_text())
        spec["input"]["axes"] = ["z", "y", "x"]
        manifest.write_text(yaml.safe_dump(spec))
    setup = (ModelRegistry(models), load_pipeline(write_test_pipeline(tmp_path, min_slices=3)))
    _coronal_original_and_axial_derived(tmp_path / "study")
    report = _run(setup, tmp_path / "study", tmp_path / "out")
    assert report.series_selection.selected.series_number == 1
    assert [w for w in report.warnings if "was passed over" in w.message] == []
