"""The upload form's selection check (``selection_refusal``, on headers alone) refuses a
study exactly when its job would fail before loading any series, and with the job's
error, word for word: over a table of studies (axial in every storage order, prone,
oblique, tilted, enhanced, a phantom, coronal and sagittal, mixed, MR, too few slices,
a localizer, series of two studies), each judged by the check and run through
``ingest_study`` as a job runs it. The screen that spares an ordinary upload the check
(``SelectionDoor.plainly_usable``, on the headers the upload reads anyway) lets through
the ordinary studies and none the check refuses.

Before 2026-12-07 no selection rule was judged at the upload: a study of only coronal
and sagittal series for axial models was answered 202 and its job failed; and the job's
error named the preferred series' plane only, while the console listed every series."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import (
    AXIAL,
    CORONAL,
    SAGITTAL,
    make_ct_series,
    make_enhanced_series,
    make_localizer,
    make_mr_series,
    new_uid,
    oblique_orientation,
)

from radserve.errors import StudyError
from radserve.ingest import IngestPolicy, discover_series
from radserve.ingest.headers import read_header
from radserve.models.registry import ModelRegistry
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.pipeline.inputs import ingest_study, selection_refusal
from radserve.pipeline.selection import SlicePlanes
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.preprocess.axes import OrientationError
from radserve.service.selection_door import SelectionDoor

PRONE = (-1.0, 0.0, 0.0, 0.0, -1.0, 0.0)
GRID = {"n_slices": 6, "rows": 16, "cols": 16, "spacing": (2.0, 1.5, 1.5)}


def _ct(folder: Path, study: str, number: int, **kwargs: object) -> None:
    make_ct_series(
        folder / f"s{number}", study_uid=study, series_number=number, **{**GRID, **kwargs}
    )


def _phantom(folder: Path, study: str) -> None:
    phantom = generate_phantom(PhantomSpec.random(3, small=True), range(10, 22))
    write_dicom_series(phantom, folder / "phantom", study_uid=study)


STUDIES: dict[str, Callable[[Path, str], None]] = {
    "axial": lambda f, s: _ct(f, s, 1),
    "axial descending": lambda f, s: _ct(f, s, 1, order="descending"),
    "axial shuffled": lambda f, s: _ct(f, s, 1, order="shuffled"),
    "prone": lambda f, s: _ct(f, s, 1, orientation=PRONE),
    "oblique 20": lambda f, s: _ct(f, s, 1, orientation=oblique_orientation(20.0)),
    "oblique 40 about x": lambda f, s: _ct(
        f, s, 1, orientation=oblique_orientation(40.0, axis=(1.0, 0.0, 0.0))
    ),
    "oblique 50 about x": lambda f, s: _ct(
        f, s, 1, orientation=oblique_orientation(50.0, axis=(1.0, 0.0, 0.0))
    ),
    "tilted 20": lambda f, s: _ct(f, s, 1, tilt_deg=20.0),
    "enhanced": lambda f, s: make_enhanced_series(
        f / "enh", n_frames=6, rows=16, cols=16, study_uid=s
    ),
    "phantom": _phantom,
    "coronal": lambda f, s: _ct(f, s, 1, orientation=CORONAL),
    "coronal and sagittal": lambda f, s: (
        _ct(f, s, 1, orientation=CORONAL),
        _ct(f, s, 2, orientation=SAGITTAL),
    ),
    "axial beside coronal": lambda f, s: (
        _ct(f, s, 1, orientation=CORONAL),
        _ct(f, s, 2, orientation=AXIAL, image_type=("DERIVED", "SECONDARY", "AXIAL")),
    ),
    "coronal beside a short axial": lambda f, s: (
        _ct(f, s, 1, orientation=CORONAL),
        _ct(f, s, 2, n_slices=2),
    ),
    "mr": lambda f, s: make_mr_series(f / "mr", n_slices=6, rows=16, cols=16, study_uid=s),
    "two slices": lambda f, s: _ct(f, s, 1, n_slices=2),
    "localizer only": lambda f, s: make_localizer(
        f / "loc", series_uid=new_uid(), study_uid=s, n_images=3
    ),
    "two studies": lambda f, s: (_ct(f, s, 1), _ct(f, new_uid(), 2)),
}
REFUSED = {
    "oblique 50 about x": OrientationError,  # nearer coronal than axial
    "coronal": OrientationError,
    "coronal and sagittal": OrientationError,
    "coronal beside a short axial": OrientationError,
    "mr": StudyError,  # unsupported_modality
    "two slices": StudyError,
    "localizer only": StudyError,
}


# judged by the screen on the headers the upload reads anyway (no discovery at the door)
PLAIN = {
    "axial", "axial descending", "axial shuffled", "prone", "oblique 20",
    "oblique 40 about x", "tilted 20", "phantom", "axial beside coronal", "two studies",
}  # fmt: skip


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    return ModelRegistry(write_test_bundles(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory, registry: ModelRegistry
) -> tuple[PipelineSpec, SlicePlanes]:
    spec = load_pipeline(write_test_pipeline(tmp_path_factory.mktemp("pipeline"), min_slices=3))
    return spec, SlicePlanes.of_pipeline(spec, registry)


@pytest.mark.parametrize("name", list(STUDIES))
def test_the_check_refuses_exactly_what_the_job_fails_before_loading(
    pipeline: tuple[PipelineSpec, SlicePlanes], tmp_path: Path, name: str
) -> None:
    spec, planes = pipeline
    policy = IngestPolicy(gantry_tilt="flag")
    STUDIES[name](tmp_path, new_uid())
    headers = discover_series(tmp_path, policy=policy)
    refusal = selection_refusal(headers, spec.series_selection, planes=planes, policy=policy)
    try:
        ingest_study(tmp_path, pipeline=spec, policy=policy, planes=planes)
        job_error: StudyError | None = None
    except StudyError as exc:
        job_error = exc
    if name not in REFUSED:
        assert refusal is None, refusal.message
        return
    assert isinstance(refusal, REFUSED[name])
    assert job_error is not None, "the job ran a study the check refused"
    assert (job_error.code, job_error.message) == (refusal.code, refusal.message)


def test_a_wrong_plane_error_names_every_series_as_the_console_lists_them(
    pipeline: tuple[PipelineSpec, SlicePlanes], tmp_path: Path
) -> None:
    spec, planes = pipeline
    STUDIES["coronal beside a short axial"](tmp_path, new_uid())
    with pytest.raises(OrientationError) as failed:
        ingest_study(tmp_path, pipeline=spec, planes=planes)
    assert failed.value.message == (
        "no series is in a plane the pipeline's slice models read (series 1: its slices are "
        "coronal, and model organs-test/1.0.0 reads axial slices; series 2: 2 images, fewer "
        "than the 3 required): send the study's axial series (or a model whose model.yaml "
        "declares the plane it was trained on in input.axes)"
    )


@pytest.mark.parametrize("name", list(STUDIES))
def test_the_screen_lets_through_only_studies_the_check_would_let_through(
    pipeline: tuple[PipelineSpec, SlicePlanes], registry: ModelRegistry, tmp_path: Path, name: str
) -> None:
    """The upload's headers, summed per series, let an ordinary study past the exact
    check (whose discovery costs 1.5 ms a file); never one the check would refuse."""
    spec, planes = pipeline
    policy = IngestPolicy(gantry_tilt="flag")
    STUDIES[name](tmp_path, new_uid())
    door = SelectionDoor(spec, registry, policy)
    for path in sorted(tmp_path.rglob("*.dcm")):
        door.seen(read_header(path))
    headers = discover_series(tmp_path, policy=policy)
    refusal = selection_refusal(headers, spec.series_selection, planes=planes, policy=policy)
    assert door.plainly_usable() is (name in PLAIN)
    if door.plainly_usable():
        assert refusal is None
