"""A study whose every series lies in another plane than the pipeline's slice models read
is refused by selection, each series named with its plane, before any series is loaded;
and the selection's plane check and inference's agree, a gantry tilt included.

Probe (2026-12-06): ``selection.refusals`` (what the console lists for a refused study)
ignored the plane, so a study of only coronal and sagittal series for axial models
listed nothing: no series broke a rule, yet the job failed (over HTTP since 2026-12-07 the
upload is refused at the door, and a C-STORE study's job names each series:
tests/integration/test_upload_selection_door.py). And the selection judged a
series' plane by its first frame's orientation while inference judged the loaded
volume's affine: with ``ingest.gantry_tilt: flag`` (the sheared affine kept) a tilted
series passed the selection and was then refused by the model (or was passed over when
the model would have read it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import (
    AXIAL,
    CORONAL,
    SAGITTAL,
    make_ct_series,
    new_uid,
    oblique_orientation,
)

from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.models.axes import SLICE_AXES
from radserve.models.registry import ModelRegistry
from radserve.pipeline.selection import SlicePlanes, refusals
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.pipeline.study import run_study
from radserve.preprocess.axes import OrientationError, slice_plane


def _hu(points: np.ndarray) -> np.ndarray:
    block = (np.abs(points - np.array([0.0, 0.0, 15.0])) < [18.0, 18.0, 14.0]).all(-1)
    return np.where(block, 100.0, -1000.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRegistry, PipelineSpec]:
    root = tmp_path_factory.mktemp("plane-refusal")
    registry = ModelRegistry(write_test_bundles(root / "models"))
    return registry, load_pipeline(write_test_pipeline(root, min_slices=3))


def _series(folder: Path, orientation: tuple[float, ...], number: int, study: str) -> None:
    make_ct_series(
        folder, n_slices=12, rows=32, cols=32, spacing=(2.0, 1.5, 1.5),
        origin=(-23.5, -23.5, 30.0), orientation=orientation, hu=_hu, study_uid=study,
        series_number=number,
    )  # fmt: skip


def test_a_study_of_only_coronal_and_sagittal_series_is_refused_naming_each_plane(
    setup: tuple[ModelRegistry, PipelineSpec], tmp_path: Path
) -> None:
    registry, pipeline = setup
    study = new_uid()
    _series(tmp_path / "study" / "coronal", CORONAL, 1, study)
    _series(tmp_path / "study" / "sagittal", SAGITTAL, 2, study)
    headers = discover_series(tmp_path / "study")
    planes = SlicePlanes.of_pipeline(pipeline, registry)
    refused = refusals(headers, pipeline.series_selection, planes)
    assert sorted((r.series_number, r.reason) for r in refused) == [
        (1, "its slices are coronal, and model organs-test/1.0.0 reads axial slices"),
        (2, "its slices are sagittal, and model organs-test/1.0.0 reads axial slices"),
    ]
    # one axial series among them: the study is not refused
    _series(tmp_path / "study" / "axial", AXIAL, 3, study)
    headers = discover_series(tmp_path / "study")
    assert refusals(headers, pipeline.series_selection, planes) == []


# (orientation's rotation about x in degrees, gantry tilt in degrees): near the
# axial/coronal boundary, where the first frame's normal and the stack's affine disagree
TILTED = [(40.0, -20.0), (40.0, -40.0), (50.0, 20.0), (50.0, 40.0), (30.0, 0.0), (60.0, 0.0)]


@pytest.mark.parametrize(("rotation", "tilt"), TILTED)
def test_the_selection_judges_a_tilted_series_plane_as_inference_does(
    tmp_path: Path, rotation: float, tilt: float
) -> None:
    make_ct_series(
        tmp_path, n_slices=8, rows=16, cols=16, spacing=(2.0, 1.0, 1.0), tilt_deg=tilt,
        orientation=oblique_orientation(rotation, axis=(1.0, 0.0, 0.0)),
    )  # fmt: skip
    policy = IngestPolicy(gantry_tilt="flag")
    (header,) = discover_series(tmp_path, policy=policy)
    planes = SlicePlanes((("axial-model/1", SLICE_AXES),))
    selected = planes.refusal(header.frames, policy)
    volume = load_series(header, policy=policy).volume
    try:
        slice_plane(SLICE_AXES, volume.affine, "axial-model/1")
        inferred = None
    except OrientationError as exc:
        inferred = exc.message
    if selected is None:
        assert inferred is None
    else:
        assert inferred is not None and selected.error().message == inferred


def test_a_tilted_series_the_models_read_is_run_not_passed_over(
    setup: tuple[ModelRegistry, PipelineSpec], tmp_path: Path
) -> None:
    """Its first frame's normal leans coronal (50 degrees), its stack (what the model
    reads) runs axial: the first-frame check refused it as coronal."""
    registry, pipeline = setup
    make_ct_series(
        tmp_path / "study", n_slices=12, rows=32, cols=32, spacing=(2.0, 1.5, 1.5),
        tilt_deg=20.0, orientation=oblique_orientation(50.0, axis=(1.0, 0.0, 0.0)), hu=_hu,
    )  # fmt: skip
    report = run_study(
        tmp_path / "study", pipeline=pipeline, out_dir=tmp_path / "out", registry=registry,
        policy=IngestPolicy(gantry_tilt="flag"),
    ).report  # fmt: skip
    assert report.series_selection.selected is not None
    assert report.series_selection.rejected == []
