"""nnU-Net folders as people have them, beyond the default 3d_fullres plans: plans written
by nnU-Net's own planners (ResEnc presets, the recommended plans since nnU-Net 2.5), 2d
configurations, and the trainer / fold / checkpoint / dataset.json variants. Each either
agrees with ``nnUNetPredictor`` on the same weights (>= 0.999 of voxels, asserted) or is
refused with a message naming what and why. Tiny networks (the planners' own choices for
a 16x32x32 median image), random weights, one fold. Needs the ``nnunet`` extra."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch", reason="the nnunet extra (torch) is not installed")
pytest.importorskip("nnunetv2", reason="the nnunet extra (nnunetv2) is not installed")

from tests.factories.agreement import agreement, radserve_labels, synthetic_ct
from tests.factories.nnunet_folder import make_results_folder, planner_plans, tiny_plans
from tests.factories.server_process import run_radserve

from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from radserve.models.manifest import load_manifest

_PLANS: dict[str, dict] = {}


@pytest.fixture(scope="session")
def planned(tmp_path_factory):
    """Plans by planner class name, each planned once per session (a child process)."""

    def get(planner: str) -> dict:
        if planner not in _PLANS:
            _PLANS[planner] = planner_plans(tmp_path_factory.mktemp(planner), planner)
        return _PLANS[planner]

    return get


def theirs(folder, ct, spacing, *, mirroring=False, checkpoint="checkpoint_final.pth"):
    predictor = load_predictor(read_results_folder(folder, checkpoint=checkpoint), checkpoint)
    predictor.use_mirroring = mirroring
    return predictor.predict_single_npy_array(ct[None].astype(np.float32), {"spacing": spacing})


@pytest.mark.slow
def test_resenc_m_plans_agree(tmp_path, planned):
    """nnUNetPlannerResEncM's plans (ResidualEncoderUNet, 1/3/4/6 blocks per stage)."""
    plans = planned("nnUNetPlannerResEncM")
    arch = plans["configurations"]["3d_fullres"]["architecture"]
    assert arch["network_class_name"].endswith("ResidualEncoderUNet")
    folder = make_results_folder(tmp_path / "results", plans=plans, folds=(0,))
    assert folder.name == "nnUNetTrainer__nnUNetResEncUNetMPlans__3d_fullres"
    bundle = import_nnunet(folder, tmp_path / "models", name="resenc")
    ct, spacing = synthetic_ct((20, 56, 52), seed=2), (2.5, 1.4, 1.3)
    nn = theirs(folder, ct, spacing)
    assert len(np.unique(nn)) >= 2
    assert agreement(radserve_labels(bundle, ct, spacing), nn) >= 0.999


@pytest.mark.slow
@pytest.mark.parametrize(
    ("planner", "spacing", "shape", "tta"),
    [
        # every axis resampled in-plane, slices kept; ResEnc's 2d network
        ("nnUNetPlannerResEncM", (2.5, 1.4, 1.3), (20, 56, 52), False),
        # 5 mm slices: nnU-Net resamples each slice apart (separate z); mirroring over
        # the two in-plane axes on both sides (4 passes per slice patch)
        ("ExperimentPlanner", (5.0, 0.9, 0.9), (8, 64, 60), True),
    ],
)
def test_2d_configuration_agrees(tmp_path, planned, planner, spacing, shape, tta):
    """A 2d model: slice-wise 2D sliding window as depth-1 patches of the 3D one."""
    plans = planned(planner)
    folder = make_results_folder(
        tmp_path / "results", plans=plans, folds=(0,), configuration="2d", mirror_axes=(0, 1)
    )
    bundle = import_nnunet(folder, tmp_path / "models", name="two-d", tta=tta)
    spec = load_manifest(bundle / "model.yaml")
    assert spec.input.patch_size == (1, 32, 32) and spec.input.spacing[0] is None
    assert spec.input.test_time_augmentation.mirror_axes == (1, 2)
    ct = synthetic_ct(shape, seed=6)
    nn = theirs(folder, ct, spacing, mirroring=tta)
    assert len(np.unique(nn)) >= 2
    assert agreement(radserve_labels(bundle, ct, spacing), nn) >= 0.999


def _lowres_plans() -> dict:
    """tiny_plans with the 3d_lowres / 3d_cascade_fullres pair nnU-Net's planner adds
    for large images (lowres inherits from fullres at a coarser spacing)."""
    plans = tiny_plans()
    plans["configurations"]["3d_lowres"] = {
        "inherits_from": "3d_fullres",
        "data_identifier": "nnUNetPlans_3d_lowres",
        "spacing": [3.0, 2.5, 2.5],
        "median_image_size_in_voxels": [27, 38, 38],
        "next_stage": "3d_cascade_fullres",
    }
    plans["configurations"]["3d_cascade_fullres"] = {
        "inherits_from": "3d_fullres",
        "previous_stage": "3d_lowres",
    }
    return plans


# TotalSegmentator-style dataset.json: many labels whose names share long prefixes, the
# reader and file ending fields.
_MANY = ["background", *(f"{s}_{side}" for s in (
    "subclavian_artery", "common_carotid_artery", "lung_upper_lobe", "adrenal_gland",
    "brachiocephalic_vein", "iliac_artery") for side in ("left", "right"))]  # fmt: skip
_TOTALSEG_JSON = {
    "labels": {n: i for i, n in enumerate(_MANY)},
    "file_ending": ".nii.gz",
    "overwrite_image_reader_writer": "NibabelIO",
}


@pytest.mark.slow
def test_lowres_alone_trainer_variant_fold_all_checkpoint_best(tmp_path):
    """3d_lowres used on its own, nnUNetTrainerNoMirroring (no mirroring axes: --tta is
    refused), fold ``all`` and ``checkpoint_best.pth`` chosen with ``--checkpoint`` on the
    CLI, 12 labels with long shared prefixes: radserve agrees with nnUNetPredictor.

    Briefly trained weights (decisive logits): with random ones nnU-Net's float16 logit
    sums flip near-tied voxels, and the coarse lowres grid spreads each flipped model
    voxel over about four native ones (measured 0.99877 with random weights, 0.99974
    with nnU-Net's sums in float32: float rounding, not a mapping error)."""
    ct, spacing = synthetic_ct((24, 64, 60), seed=7), (2.5, 1.4, 1.3)
    folder = make_results_folder(
        tmp_path / "results",
        plans=_lowres_plans(),
        folds=("all",),
        configuration="3d_lowres",
        trainer="nnUNetTrainerNoMirroring",
        checkpoint="checkpoint_best.pth",
        mirror_axes=None,
        dataset_extra=_TOTALSEG_JSON,
        train_on=ct,
        train_steps=30,
        train_lr=1e-2,
    )
    with pytest.raises(ImportRefusedError, match=r"checkpoint_final.pth .*\['checkpoint_best"):
        read_results_folder(folder)
    models = tmp_path / "models"
    done = run_radserve(
        "models", "import", "nnunet", str(folder), "--models-dir", str(models),
        "--name", "lowres", "--checkpoint", "checkpoint_best.pth", "--fold", "all",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    bundle = models / "lowres" / "1.0.0"
    spec = load_manifest(bundle / "model.yaml")
    assert spec.input.spacing == (3.0, 2.5, 2.5) and spec.num_classes == 13
    codes = [label.concept.value for label in spec.labels]
    assert len(set(codes)) == 12 and all(len(c) <= 16 for c in codes)
    record = json.loads((bundle / "import.json").read_text())
    assert (record["checkpoint"], record["folds"]) == ("checkpoint_best.pth", ["all"])
    assert record["test_time_augmentation"]["mirror_axes"] == []
    nn = theirs(folder, ct, spacing, checkpoint="checkpoint_best.pth")
    assert len(np.unique(nn)) >= 2
    assert agreement(radserve_labels(bundle, ct, spacing), nn) >= 0.999
    refused = run_radserve(
        "models", "import", "nnunet", str(folder), "--models-dir", str(models),
        "--checkpoint", "checkpoint_best.pth", "--tta", "--version", "2",
    )  # fmt: skip
    assert refused.returncode != 0 and "allows no mirroring axes" in refused.stderr


_EXT_TRAINER = """
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


class MyLabTrainer(nnUNetTrainer):
    pass
"""


@pytest.mark.slow
def test_a_refused_onnx_export_leaves_the_models_folder_as_it_was(tmp_path):
    """A patch the network cannot take (33 voxels, not a multiple of its strides: the
    decoder's upsampled map misses the skip connection's by one): torch's export fails,
    the import is refused naming the network, and the models folder holds what it held
    before, with no half-written version and no staging folder; a models folder the
    import would have made is not left either."""
    models = tmp_path / "models"
    import_nnunet(make_results_folder(tmp_path / "good", folds=(0,)), models, name="tiny")
    before = sorted(p.relative_to(models) for p in models.rglob("*"))
    broken = make_results_folder(tmp_path / "broken", folds=(0,), patch=(16, 33, 33))
    with pytest.raises(ImportRefusedError, match=r"network \(\w+\) does not export"):
        import_nnunet(broken, models, name="tiny", version="2.0.0")
    assert sorted(p.relative_to(models) for p in models.rglob("*")) == before
    with pytest.raises(ImportRefusedError, match="does not export"):
        import_nnunet(broken, tmp_path / "fresh", name="tiny")
    assert not (tmp_path / "fresh").exists()


@pytest.mark.slow
def test_a_custom_trainer_and_a_cascade_are_refused_by_name(tmp_path, monkeypatch):
    custom = make_results_folder(tmp_path / "a", folds=(0,), trainer="MyLabTrainer")
    with pytest.raises(ImportRefusedError, match=r"trainer 'MyLabTrainer' .* nnUNet_extTrainer"):
        import_nnunet(custom, tmp_path / "models")
    # Where nnU-Net's own prediction would find it (nnUNet_extTrainer), so does the import.
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "my_lab_trainer.py").write_text(_EXT_TRAINER)
    monkeypatch.setenv("nnUNet_extTrainer", str(tmp_path / "ext"))
    bundle = import_nnunet(custom, tmp_path / "models", name="custom")
    assert json.loads((bundle / "import.json").read_text())["trainer"] == "MyLabTrainer"
    cascade = make_results_folder(
        tmp_path / "b", plans=_lowres_plans(), folds=(0,), configuration="3d_cascade_fullres"
    )
    with pytest.raises(ImportRefusedError, match="cascade"):
        import_nnunet(cascade, tmp_path / "models")


@pytest.mark.slow
def test_reorienting_reader_agrees_through_nifti_files(tmp_path):
    """NibabelIOWithReorient (TotalSegmentator's reader): nnU-Net reads a NIfTI of the
    volume turned to RAS+, predicts, and writes its labels back in the file's own
    orientation; radserve runs the same volume (a DICOM-like LPS axial grid: columns to
    the patient's left, rows to posterior, so two axes flip) with ``input.axes`` [S, A,
    R]. The NIfTI route is nnU-Net's own reader and writer, end to end."""
    import nibabel as nib
    from nnunetv2.imageio.nibabel_reader_writer import NibabelIOWithReorient
    from tests.factories.monai_bundle import write_nifti

    from radserve.domain.volume import Volume

    plans = {**tiny_plans(), "image_reader_writer": "NibabelIOWithReorient"}
    folder = make_results_folder(
        tmp_path / "results",
        plans=plans,
        folds=(0,),
        dataset_extra={"overwrite_image_reader_writer": "NibabelIOWithReorient"},
    )
    bundle = import_nnunet(folder, tmp_path / "models", name="reoriented")
    assert load_manifest(bundle / "model.yaml").input.axes == ("S", "A", "R")
    ct, spacing = synthetic_ct((20, 56, 52), seed=8), (2.5, 1.4, 1.3)
    volume = Volume.from_geometry(ct, spacing=spacing)
    nifti = write_nifti(volume, tmp_path / "ct.nii.gz")
    io = NibabelIOWithReorient()
    image, props = io.read_images([str(nifti)])
    predictor = load_predictor(read_results_folder(folder))
    seg = predictor.predict_single_npy_array(image.astype(np.float32), props)
    io.write_seg(seg, str(tmp_path / "seg.nii.gz"), props)
    nn = np.asarray(nib.load(tmp_path / "seg.nii.gz").dataobj).transpose(2, 1, 0)
    assert len(np.unique(nn)) >= 2
    ours = agreement(radserve_labels(bundle, ct, spacing), nn)
    assert ours >= 0.999
    # Control: the same weights fed the series' own voxel order (as if SimpleITKIO) agree
    # less, so the axes are what makes the labels equal.
    plain = tmp_path / "plain" / folder.name
    shutil.copytree(folder, plain)
    (plain / "plans.json").write_text(json.dumps({**plans, "image_reader_writer": "SimpleITKIO"}))
    (plain / "dataset.json").write_text(json.dumps(read_results_folder(folder).dataset | {
        "overwrite_image_reader_writer": "SimpleITKIO"}))  # fmt: skip
    unturned = import_nnunet(plain, tmp_path / "models", name="unturned")
    assert agreement(radserve_labels(unturned, ct, spacing), nn) < ours - 0.01
