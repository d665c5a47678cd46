"""A model's grid of a study is bounded by the site's ``ingest.max_voxels`` and refused
(``series_too_large``) before it is allocated, naming the grid, the bound and the setting.

User trial (2026-12-07): the resampler's bound was a constant of its own, 2**31 voxels
(8 GiB as float32), whatever the site set: a study of 1e9 voxels, within the default
``ingest.max_voxels`` (2**30), resampled by a model to a finer spacing could build a
grid twice the size the site said it builds. The bound now travels from the ingest
policy (``run_study``'s and a job's ``policy``) through the pipeline's
:class:`~radserve.pipeline.volume.VolumeRun` to each model's task and the resampler.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tests.factories.dicom_series import make_ct_series
from tests.factories.onnx_models import blur3d_model, model_spec
from tests.factories.scheduling_fakes import RecordingHooks

from radserve.config import IngestSettings
from radserve.domain.volume import Volume
from radserve.errors import StudyError
from radserve.inference import PatchTask, SliceTask
from radserve.ingest import IngestPolicy
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, StudyRequest
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.pipeline.study import run_study
from radserve.preprocess.resample import DEFAULT_MAX_VOXELS, check_grid, resample_to_spacing
from radserve.scheduling import JobState, PriorityClass, Scheduler, run_serial

NATIVE = (2.0, 1.0, 1.0)  # mm: slice step, rows, columns
FINE = (1.0, 0.5, 0.5)  # a model's spacing: 8 times the voxels
SETTING = "ingest.max_voxels"


def _volume(shape: tuple[int, int, int] = (8, 24, 24)) -> Volume:
    return Volume.from_geometry(np.full(shape, 100, np.int16), spacing=NATIVE)


def _refusal(excinfo: pytest.ExceptionInfo[StudyError]) -> str:
    assert excinfo.value.code == "series_too_large"
    return excinfo.value.message


# --- the resampler ------------------------------------------------------------------------------
def test_the_default_bound_is_the_ingest_default() -> None:
    """One definition: a caller with no settings gets ``ingest.max_voxels``' default."""
    assert DEFAULT_MAX_VOXELS == IngestPolicy().max_voxels == IngestSettings().max_voxels
    check_grid((1024, 1024, 1024))  # 2**30: the default's own size passes
    with pytest.raises(StudyError) as refused:
        check_grid((1024, 1024, 1025))  # passed under the old 2**31 constant
    assert f"{SETTING}={2**30}" in _refusal(refused)


def test_resample_to_spacing_refuses_a_grid_past_the_bound_it_is_given() -> None:
    volume = _volume()
    fits = resample_to_spacing(volume, FINE, order=1, max_voxels=16 * 48 * 48)
    assert fits.shape == (16, 48, 48)
    with pytest.raises(StudyError) as refused:
        resample_to_spacing(volume, FINE, order=1, max_voxels=16 * 48 * 48 - 1)
    message = _refusal(refused)
    assert "8 × 24 × 24 voxels at 2 × 1 × 1 mm resampled to 1 × 0.5 × 0.5 mm" in message
    assert f"16 × 48 × 48 = 36864 voxels, more than {SETTING}=36863" in message


# --- each model's task, before its grid is allocated -------------------------------------------
@pytest.mark.parametrize(
    ("resampling", "grid"),
    [
        (None, "16 × 48 × 48 = 36864"),  # radserve's own linear resampling
        ({"image_order": 1}, "16 × 48 × 48 = 36864"),  # nnU-Net's resize
        ({"grid": "first_voxel"}, "15 × 47 × 47 = 33135"),  # MONAI's Spacing grid
    ],
    ids=["radserve", "nnunet", "monai"],
)
def test_a_3d_model_grid_past_the_site_bound_is_refused(
    resampling: dict[str, Any] | None, grid: str
) -> None:
    extra = {"resampling": resampling} if resampling else {}
    spec = model_spec(mode="3d", spacing=FINE, patch_size=(8, 8, 8), crop="none", **extra)
    voxels = int(grid.rsplit("= ", 1)[1])
    assert PatchTask(_volume(), spec, max_voxels=voxels)._resampled  # at the bound: runs
    with pytest.raises(StudyError) as refused:
        PatchTask(_volume(), spec, max_voxels=voxels - 1)
    message = _refusal(refused)
    assert message.startswith(f"the {spec.key} model grid of the crop's 8 × 24 × 24 voxels")
    assert f"would be {grid} voxels, more than {SETTING}={voxels - 1}" in message
    assert f"RADSERVE_INGEST__MAX_VOXELS={voxels}" in message  # how to lift it, if genuine


def test_the_refusal_comes_before_the_grid_is_allocated() -> None:
    """A 1 MiB-voxel site, a 64k-voxel study, a model grid of 4M voxels (16 MiB as float32
    per copy): refused having allocated a fraction of one copy."""
    spec = model_spec(mode="3d", spacing=(0.5, 0.25, 0.25), patch_size=(8, 8, 8), crop="none")
    volume = _volume((16, 64, 64))
    tracemalloc.start()
    try:
        with pytest.raises(StudyError) as refused:
            PatchTask(volume, spec, max_voxels=2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "64 × 256 × 256 = 4194304 voxels" in _refusal(refused)
    assert peak < 2**20  # bytes; one float32 copy of the grid is 16 MiB


def test_a_2d_model_s_slices_count_as_one_grid() -> None:
    """Resampled a batch at a time, the slices at the model's spacing are still the work
    of one volume of that many voxels."""
    spec = model_spec(mode="2d", spacing=(None, 0.5, 0.5), crop="none")
    assert SliceTask(_volume(), spec, max_voxels=8 * 48 * 48).total_batches > 0
    with pytest.raises(StudyError) as refused:
        SliceTask(_volume(), spec, max_voxels=8 * 48 * 48 - 1)
    message = _refusal(refused)
    assert "resampled to 2 × 0.5 × 0.5 mm would be 8 × 48 × 48 = 18432 voxels" in message


# --- a job: the site's bound reaches the model step --------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRegistry, PipelineSpec, Path]:
    root = tmp_path_factory.mktemp("grid-bound")
    folder = root / "models" / "fine-3d" / "1.0.0"
    folder.mkdir(parents=True)
    blur3d_model(folder / "model.onnx")
    concept = {"value": "1", "scheme": "99TEST", "meaning": "dense"}
    manifest = {
        "name": "fine-3d",
        "version": "1.0.0",
        "task": "segmentation",
        "modality": "CT",
        "input": {
            "mode": "3d",
            "spacing": list(FINE),
            "patch_size": [8, 8, 8],
            "crop": "none",
            "normalisation": {"kind": "ct_window", "center": 500.0, "width": 1000.0},
        },
        "labels": [
            {
                "value": 1,
                "name": "dense",
                "kind": "structure",
                "concept": concept,
                "category": concept,
            }
        ],
    }
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    pipelines = root / "pipelines"
    pipelines.mkdir()
    (pipelines / "fine.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "fine",
                "version": "1.0.0",
                "series_selection": {"modalities": ["CT"], "min_slices": 3},
                "steps": [{"model": "fine-3d"}],
            }
        )
    )
    study = root / "study"
    make_ct_series(study, n_slices=8, rows=24, cols=24, spacing=NATIVE)
    return ModelRegistry(root / "models"), load_pipeline("fine", pipelines), study


def test_a_job_fails_with_the_site_s_bound_and_runs_once_it_is_raised(site, tmp_path) -> None:
    """The 8 × 24 × 24 study (4,608 voxels) is within a site's max_voxels of 20,000; the
    model's grid of it (36,864) is not. Before, the job ran and built it."""
    registry, pipeline, study = site
    hooks = RecordingHooks()
    scheduler = Scheduler(hooks=hooks)
    for job_id, max_voxels in (("small-site", 20_000), ("large-site", 40_000)):
        request = StudyRequest(
            job_id=job_id,
            source=study,
            pipeline=pipeline,
            out_dir=tmp_path / job_id,
            priority=PriorityClass.INPATIENT,
            policy=IngestPolicy(max_voxels=max_voxels),
        )
        scheduler.submit(request.job(registry=registry, sessions=SessionPool()))
    run_serial(scheduler)
    refused, ran = hooks.final("small-site"), hooks.final("large-site")
    assert refused is not None and refused.state is JobState.FAILED
    assert refused.error_code == "series_too_large"
    assert refused.error_message is not None
    assert "would be 16 × 48 × 48 = 36864 voxels, more than ingest.max_voxels=20000" in (
        refused.error_message
    )
    assert ran is not None and ran.state is JobState.SUCCEEDED, ran


def test_run_study_passes_its_policy_s_bound(site, tmp_path: Path) -> None:
    registry, pipeline, study = site
    with pytest.raises(StudyError) as refused:
        run_study(
            study,
            pipeline=pipeline,
            out_dir=tmp_path / "out",
            registry=registry,
            policy=IngestPolicy(max_voxels=20_000),
            key_images=False,
        )
    assert f"{SETTING}=20000" in _refusal(refused)
