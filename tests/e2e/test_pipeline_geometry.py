"""A study through the whole pipeline (ingest -> models -> findings -> report files) with
tiny threshold models: findings must land on the right voxels and patient coordinates
whatever the acquisition geometry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import AXIAL, make_ct_series, make_mr_series, oblique_orientation

from radserve.errors import UnsupportedModalityError
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study
from radserve.report.json_report import read_report
from radserve.report.nifti import read_nifti

LESION_CENTRE = np.array([6.0, -4.0, 21.0])  # LPS mm
LESION_RADIUS = 6.0
GRID = {"n_slices": 30, "rows": 64, "cols": 64, "spacing": (1.5, 1.0, 1.0)}


def _phantom_hu(points: np.ndarray) -> np.ndarray:
    """Air, a 'liver' block of 100 HU around the centre, a 700 HU sphere inside it."""
    centred = points - np.array([0.0, 0.0, 21.0])
    inside_block = (np.abs(centred) < np.array([25.0, 25.0, 40.0])).all(axis=-1)
    hu = np.where(inside_block, 100.0, -1000.0)
    in_sphere = np.linalg.norm(points - LESION_CENTRE, axis=-1) <= LESION_RADIUS
    return np.where(in_sphere, 700.0, hu)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRegistry, object, Path]:
    root = tmp_path_factory.mktemp("pipeline")
    registry = ModelRegistry(write_test_bundles(root / "models"))
    return registry, load_pipeline(write_test_pipeline(root)), root


def _origin(orientation: tuple[float, ...]) -> np.ndarray:
    """Origin that centres the grid on (0, 0, 21) for any orientation."""
    row, col = np.array(orientation[:3]), np.array(orientation[3:])
    normal = np.cross(row, col)
    n, r, c = GRID["n_slices"], GRID["rows"], GRID["cols"]
    dz, dy, dx = GRID["spacing"]
    centre = np.array([0.0, 0.0, 21.0])
    return centre - normal * dz * (n - 1) / 2 - col * dy * (r - 1) / 2 - row * dx * (c - 1) / 2


CASES = {
    "axial": (AXIAL, "ascending"),
    "axial-files-head-first": (AXIAL, "descending"),
    "axial-shuffled": (AXIAL, "shuffled"),
    "flipped": ((-1.0, 0.0, 0.0, 0.0, -1.0, 0.0), "ascending"),
    "oblique": (tuple(oblique_orientation(20.0)), "ascending"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_finding_lands_at_patient_position(setup, tmp_path: Path, case: str) -> None:
    registry, pipeline, _ = setup
    orientation, order = CASES[case]
    make_ct_series(
        tmp_path / "study",
        **GRID,
        orientation=orientation,
        origin=_origin(orientation),
        hu=_phantom_hu,
        order=order,
    )
    result = run_study(
        tmp_path / "study", pipeline=pipeline, out_dir=tmp_path / "out", registry=registry
    )
    report = result.report
    assert len(report.findings) == 1, report.findings
    finding = report.findings[0]
    assert finding.containing_organ == "liver"
    np.testing.assert_allclose(finding.centroid_mm, LESION_CENTRE, atol=1.0)
    assert finding.longest_diameter_mm == pytest.approx(2 * LESION_RADIUS, abs=2.0)
    assert finding.volume_ml == pytest.approx(4 / 3 * np.pi * LESION_RADIUS**3 / 1000, rel=0.25)
    assert finding.mean_hu == pytest.approx(700, abs=60)

    # The findings label map, read back from NIfTI, has the finding at the lesion centre.
    labels = read_nifti(tmp_path / "out" / "findings.nii.gz")
    assert np.allclose(labels.affine, read_report(result.report_path).geometry.affine, atol=1e-4)
    voxel = np.rint(labels.patient_to_index(LESION_CENTRE)[0]).astype(int)
    assert labels.array[tuple(voxel)] == finding.label_value
    organs = read_nifti(tmp_path / "out" / "organs.nii.gz")
    assert organs.array[tuple(voxel)] == 1
    assert (tmp_path / "out" / "keyimages" / "finding-001.png").is_file()


def test_report_names_models_and_timings(setup, tmp_path: Path) -> None:
    registry, pipeline, _ = setup
    make_ct_series(tmp_path / "study", **GRID, origin=_origin(AXIAL), hu=_phantom_hu)
    report = run_study(
        tmp_path / "study", pipeline=pipeline, out_dir=tmp_path / "out", registry=registry
    ).report
    assert [m.name for m in report.models] == ["organs-test", "lesions-test"]
    assert all(m.onnx_sha256 and len(m.onnx_sha256) == 64 for m in report.models)
    assert report.timings["total"] > 0
    assert {"ingest: load", "organs-test: inference", "report"} <= set(report.timings)
    assert report.series_selection.selected is not None


def test_mr_where_ct_required_is_a_clear_error(setup, tmp_path: Path) -> None:
    registry, pipeline, _ = setup
    make_mr_series(tmp_path / "study", n_slices=10)
    with pytest.raises(UnsupportedModalityError, match="needs CT"):
        run_study(
            tmp_path / "study", pipeline=pipeline, out_dir=tmp_path / "out", registry=registry
        )
    assert not (tmp_path / "out" / "report.json").exists()


def test_series_too_short_is_rejected_with_reason(setup, tmp_path: Path) -> None:
    registry, _, root = setup
    strict = load_pipeline(write_test_pipeline(root / "strict", min_slices=50))
    make_ct_series(tmp_path / "study", **GRID, origin=_origin(AXIAL), hu=_phantom_hu)
    with pytest.raises(Exception, match="fewer than the 50 required"):
        run_study(tmp_path / "study", pipeline=strict, out_dir=tmp_path / "out", registry=registry)
