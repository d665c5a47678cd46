"""The MONAI baseline of ``radserve bench`` agrees with radserve on a tiny study.

Skips where MONAI or torch (the optional ``[monai]`` extra) is not installed,
as in CI. Both run the models on the same crop and resampled grid, so the answers must
agree voxel for voxel, whatever the slice order or where the origin lies.
"""

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
    oblique_orientation,
)

from radserve.evaluation.metrics import dice
from radserve.ingest import load_study
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study

pytest.importorskip("monai")
pytest.importorskip("torch")

from radserve.bench.monai_baseline import load_ct, run_monai

GRID = {"n_slices": 16, "rows": 56, "cols": 48, "spacing": (2.0, 0.7, 0.9)}
LESION = np.array([3.0, -2.0, 0.0])


def _phantom(centre: np.ndarray):
    """Air around a soft-tissue body, a 100 HU 'liver' block in it, a 700 HU lesion."""

    def hu(points: np.ndarray) -> np.ndarray:
        local = points - centre
        body = (np.abs(local[..., :2]) < np.array([12.0, 10.0])).all(axis=-1)
        block = (np.abs(local) < np.array([8.0, 7.0, 12.0])).all(axis=-1)
        values = np.where(block, 100.0, np.where(body, 0.0, -1000.0))
        return np.where(np.linalg.norm(local - LESION, axis=-1) <= 3.5, 700.0, values)

    return hu


def _origin(centre: np.ndarray) -> tuple[float, float, float]:
    """Origin of the axial grid centred on ``centre`` (LPS mm)."""
    n, r, c = GRID["n_slices"], GRID["rows"], GRID["cols"]
    dz, dy, dx = GRID["spacing"]
    half = np.array([dx * (c - 1), dy * (r - 1), dz * (n - 1)]) / 2
    return tuple(float(v) for v in centre - half)  # type: ignore[return-value]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRegistry, object]:
    root = tmp_path_factory.mktemp("monai")
    return ModelRegistry(write_test_bundles(root / "models")), load_pipeline(
        write_test_pipeline(root)
    )


CASES = {
    "ascending": ("ascending", np.zeros(3)),
    "head-first-files": ("descending", np.zeros(3)),
    # First voxel centre at ~0.2 mm: where MONAI's Spacing(scale_extent=True) would
    # misplace the field-of-view-preserving grid.
    "origin-near-zero": ("ascending", np.array([21.35, 19.45, 15.2])),
}


ORIENTATIONS = {
    "axial-head-first-files": (AXIAL, "descending"),
    "flipped": ((-1.0, 0.0, 0.0, 0.0, -1.0, 0.0), "ascending"),
    "coronal": (CORONAL, "ascending"),
    "sagittal-head-first-files": (SAGITTAL, "descending"),
    "oblique": (tuple(oblique_orientation(20.0)), "ascending"),
}


@pytest.mark.parametrize("case", sorted(ORIENTATIONS))
def test_load_ct_matches_radserve_ingest(tmp_path: Path, case: str) -> None:
    """MONAI's reader, converted to (slice, row, column) LPS, gives radserve's volume."""
    orientation, order = ORIENTATIONS[case]
    rng = np.random.default_rng(0)
    hu = rng.integers(-1000, 1500, size=(6, 20, 14)).astype(float)
    make_ct_series(
        tmp_path, n_slices=6, rows=20, cols=14, orientation=orientation, hu=hu, order=order
    )
    ct = load_ct(tmp_path)
    ref = load_study(tmp_path).series[0].volume
    np.testing.assert_allclose(ct.affine, ref.affine, atol=1e-4)
    np.testing.assert_array_equal(ct.array, ref.array)


@pytest.mark.parametrize("case", sorted(CASES))
def test_monai_baseline_agrees_with_radserve(setup, tmp_path: Path, case: str) -> None:
    registry, pipeline = setup
    order, centre = CASES[case]
    study = tmp_path / "study"
    make_ct_series(study, **GRID, origin=_origin(centre), hu=_phantom(centre), order=order)

    # Loaded by MONAI, in radserve's order and geometry.
    ct = load_ct(study)
    ref = load_study(study).series[0].volume
    np.testing.assert_allclose(ct.affine, ref.affine, atol=1e-4)
    np.testing.assert_allclose(ct.array, ref.array, atol=1e-3)

    result = run_study(study, pipeline=pipeline, out_dir=tmp_path / "out", registry=registry)
    organs = result.volume_result.organ_step.labels.array
    findings = result.volume_result.lesion_step.finding_labels.array > 0
    out = run_monai(study, tmp_path / "monai", "fp32", pipeline=pipeline, registry=registry)
    labels = np.load(tmp_path / "monai" / "labels.npz")

    assert organs.any() and findings.any()
    assert labels["organs"].shape == organs.shape
    assert dice(labels["organs"] == 1, organs == 1) >= 0.999
    assert dice(labels["findings"] > 0, findings) >= 0.999
    assert out["seconds"] > 0 and out["peak_rss_mb"] >= out["rss_after_warmup_mb"] > 0
    assert {"load", "organs-test: inference", "lesions-test: inference"} <= set(out["stages"])
