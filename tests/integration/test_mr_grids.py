"""Multi-sequence MR on different grids: each channel onto the reference sequence's grid.

``radserve phantom --mr --mr-grids`` writes T1 (3D, 3.0 mm isotropic), T2 (1.6 mm pixels,
6 mm slices, a smaller field of view and coverage) and FLAIR (2 mm pixels, 5 mm slices
with a 1 mm gap, tilted 15 degrees) in one Frame of Reference. A three-channel model
(T1 the reference) reads T2 and FLAIR resampled onto the T1's grid: radserve's arrays
equal an independent computation from the files' own headers
(tests/factories/dicom_resample.py) for each interpolation a model may declare, the share
each sequence covers is flagged, and too little coverage or a second Frame of Reference
is refused naming the channel.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_resample import onto, read_grid
from tests.factories.onnx_models import conv_model

from radserve.importers.channel_series import NAMED_SERIES
from radserve.ingest import discover_series
from radserve.models.registry import ModelRegistry
from radserve.phantom import PhantomSpec, generate_phantom
from radserve.phantom.mr import write_mr_series
from radserve.phantom.mr_grids import VARIED_GRIDS, second_frame_of_reference
from radserve.pipeline.channels import ChannelSeriesError, load_channels
from radserve.pipeline.inputs import ingest_study
from radserve.pipeline.spec import PipelineSpec
from radserve.preprocess.onto_grid import INTERPOLATION_ORDERS

SEED = 0
NAMES = {"t1": "T1", "t2": "T2", "flair": "FLAIR"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    phantom = generate_phantom(PhantomSpec.random(SEED, small=True))
    out = tmp_path_factory.mktemp("mr-grids")
    files = {
        name: write_mr_series(phantom, out, sequence, grid=VARIED_GRIDS[sequence])
        for name, sequence in NAMES.items()
    }
    return phantom, out, files


def _registry(root: Path, **input_fields: object) -> ModelRegistry:
    folder = root / "mr-seq" / "1.0.0"
    folder.mkdir(parents=True)
    conv_model(folder / "model.onnx", np.ones((2, 3, 1, 1, 1), np.float32), np.zeros(2, np.float32))
    norm = {"kind": "clip_zscore", "lower": 0.0, "upper": 4095.0, "mean": 0.0, "std": 1.0}
    channels = [
        {"name": name, "modality": "MR", "normalisation": norm,
         "series_description": NAMED_SERIES[sequence].series_description}
        for name, sequence in NAMES.items()
    ]  # fmt: skip
    manifest = {
        "name": "mr-seq",
        "version": "1.0.0",
        "task": "segmentation",
        "modality": "MR",
        "input": {
            "mode": "3d",
            "spacing": [4.0, 4.0, 4.0],
            "patch_size": [16, 16, 16],
            "channels": channels,
            **input_fields,
        },
        "labels": [
            {"value": 1, "name": "tissue",
             "concept": {"value": "85756007", "scheme": "SCT", "meaning": "Tissue"},
             "category": {"value": "91723000", "scheme": "SCT", "meaning": "Anatomical Structure"}}
        ],
    }  # fmt: skip
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return ModelRegistry([root])


def _pipeline(model: str = "mr-seq") -> PipelineSpec:
    t1 = NAMED_SERIES["T1"].series_description
    return PipelineSpec.model_validate(
        {
            "name": "mr-grids",
            "version": "0.0.1",
            "series_selection": {"modalities": ["MR"], "series_description": t1},
            "steps": [{"model": model, "output": "tissue"}],
        }
    )


def test_each_sequence_has_its_own_grid_in_one_frame_of_reference(study) -> None:
    phantom, out, files = study
    headers = {h.series_description: h for h in discover_series(out)}
    assert len(headers) == 3
    grids = {name: read_grid(paths) for name, paths in files.items()}
    spacings = {
        n: tuple(np.round(np.linalg.norm(g.affine[:3, :3], axis=0), 3)) for n, g in grids.items()
    }
    assert spacings == {"t1": (3.0, 3.0, 3.0), "t2": (6.0, 1.6, 1.6), "flair": (6.0, 2.0, 2.0)}
    shapes = {n: g.array.shape for n, g in grids.items()}
    assert len(set(shapes.values())) == 3, shapes
    tilt = np.degrees(np.arccos(abs(grids["flair"].affine[2, 0]) / 6.0))
    assert tilt == pytest.approx(15.0, abs=0.01), "the FLAIR is an oblique axial"
    for name in ("t1", "t2"):
        assert np.allclose(grids[name].affine[:3, 0] / np.linalg.norm(grids[name].affine[:3, 0]),
                           [0, 0, 1], atol=1e-6)  # fmt: skip
    uids = {h.frame_of_reference_uid for h in headers.values()}
    assert uids == {phantom.ct.frame_of_reference_uid}
    import pydicom

    flair = pydicom.dcmread(files["flair"][0])
    assert (float(flair.SliceThickness), float(flair.SpacingBetweenSlices)) == (5.0, 6.0)
    assert pydicom.dcmread(files["t1"][0]).MRAcquisitionType == "3D"
    for paths in files.values():
        assert dciodvfy_errors(paths[0]) == [], paths[0]


@pytest.mark.parametrize("interpolation", ["linear", "cubic", "nearest"])
def test_the_channels_on_the_t1_grid_equal_an_independent_resampling(
    study, tmp_path, interpolation
) -> None:
    _phantom, out, files = study
    registry = _registry(tmp_path, channel_interpolation=interpolation)
    pipeline = _pipeline()
    ingested, inputs = load_channels(ingest_study(out, pipeline=pipeline), pipeline, registry)
    reference = read_grid(files["t1"])
    assert np.allclose(ingested.loaded.volume.affine, reference.affine, atol=1e-4)
    assert np.array_equal(ingested.loaded.volume.array, reference.array)
    arrays = inputs.arrays["mr-seq/1.0.0"]
    order = INTERPOLATION_ORDERS[interpolation]
    for name in ("t2", "flair"):
        source = read_grid(files[name])
        want, covered = onto(source, reference, order)
        ours = arrays[name]
        # stored values 0..4095; the file's Image Orientation has 6 decimals, which radserve
        # makes orthonormal and the test takes as written: 3e-6 mm apart, 0.01 at edges
        close = np.abs(ours - want) <= 0.1
        if order == 0:  # a voxel centre exactly between two source voxels may go either way
            for nudge in (-1e-4, 1e-4):
                close |= np.abs(ours - onto(source, reference, 0, nudge)[0]) <= 0.01
        print(f"{interpolation} {name}: covered {covered.mean():.4f}, close {close.mean():.6f}")
        assert float(close.mean()) >= 0.9999, name
        assert 0.3 < covered.mean() < 0.95, "partial coverage, on purpose"
        flagged = [w for w in ingested.loaded.warnings if f"channel {name!r}" in w]
        assert len(flagged) == 1 and flagged[0].startswith("channel_partial_coverage")
        assert f"images {covered.mean():.1%} of the reference" in flagged[0]


def test_too_little_coverage_or_a_second_frame_is_refused_naming_the_channel(
    study, tmp_path
) -> None:
    phantom, out, files = study
    pipeline = _pipeline()
    registry = _registry(tmp_path / "floor", min_channel_coverage=0.6)
    floor = r"channel 't2' images \d+\.\d% of the reference series' volume \(the model needs at "
    floor += r"least 60%\)"
    with pytest.raises(ChannelSeriesError, match=floor):
        load_channels(ingest_study(out, pipeline=pipeline), pipeline, registry)

    moved = tmp_path / "moved"
    moved.mkdir()
    for path in [*files["t1"], *files["t2"]]:
        shutil.copy(path, moved)
    write_mr_series(phantom, moved, "FLAIR", grid=VARIED_GRIDS["FLAIR"],
                    frame_of_reference_uid=second_frame_of_reference(SEED))  # fmt: skip
    registry = _registry(tmp_path / "models")
    with pytest.raises(ChannelSeriesError, match=r"channel 'flair' is not in the reference"):
        load_channels(ingest_study(moved, pipeline=pipeline), pipeline, registry)


@pytest.mark.slow
def test_an_nnunet_model_on_the_three_grids_agrees_with_nnunet_predictor(study, tmp_path) -> None:
    """nnU-Net imports say cubic (its data order): radserve's run of the imported T1 + T2 +
    FLAIR model on the study vs ``nnUNetPredictor`` on the T1 and the test's own cubic
    resampling of the T2 and FLAIR onto it, same weights, TTA off."""
    pytest.importorskip("torch", reason="the nnunet extra (torch) is not installed")
    pytest.importorskip("nnunetv2", reason="the nnunet extra (nnunetv2) is not installed")
    from tests.factories.nnunet_folder import make_results_folder, tiny_plans

    from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
    from radserve.models.manifest import load_manifest
    from radserve.pipeline.study import run_study

    _phantom, out, files = study
    plans = tiny_plans(
        schemes=("ZScoreNormalization",) * 3, use_mask=(True,) * 3, spacing=(6.0, 6.0, 6.0)
    )
    folder = make_results_folder(
        tmp_path / "results", folds=(0,), plans=plans, channel_names=("T1", "T2", "FLAIR")
    )
    bundle = import_nnunet(folder, tmp_path / "models", name="mr-nnunet")
    spec = load_manifest(bundle / "model.yaml")
    reference = spec.input.reference_channel
    assert reference is not None and reference.name == "t1"
    assert spec.input.channel_interpolation == "cubic"
    result = run_study(
        out,
        pipeline=_pipeline("mr-nnunet"),
        out_dir=tmp_path / "run",
        registry=ModelRegistry([tmp_path / "models"]),
        key_images=False,
    )
    ours = result.volume_result.steps[0].labels.array
    t1 = read_grid(files["t1"])
    on_t1 = [onto(read_grid(files[name]), t1, 3)[0] for name in ("t2", "flair")]
    stacked = np.stack([t1.array, *on_t1]).astype(np.float32)
    spacing = [float(v) for v in np.linalg.norm(t1.affine[:3, :3], axis=0)]
    predictor = load_predictor(read_results_folder(folder))
    theirs = np.asarray(predictor.predict_single_npy_array(stacked, {"spacing": spacing}))
    assert ours.shape == theirs.shape == t1.array.shape
    assert len(np.unique(theirs)) >= 2
    agreement = float((ours == theirs).mean())
    print(f"nnU-Net on three grids: radserve vs nnUNetPredictor {agreement:.5f}")
    assert agreement >= 0.999, agreement
