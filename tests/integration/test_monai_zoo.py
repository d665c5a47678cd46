"""The MONAI Model Zoo's CT/MR 3D segmentation bundles through ``radserve models import
monai-bundle``: each is imported and agrees with MONAI's own run of it, or is refused
naming the transform or option and why.

The configs are the zoo's own (tests/data/monai_zoo/, Apache-2.0, commit in its
README.md); weights are never downloaded: each network is the bundle's ``network_def``
with seeded random weights, or a smaller variant of the same class where the zoo's is
too big for CI (said per case). Preprocessing, inferer and postprocessing are the zoo's,
untouched. The table in docs/bring-your-own-model.md "MONAI Model Zoo bundles" follows
these cases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("monai")
pytest.importorskip("torch")

from tests.factories import monai_bundle as mb

from radserve.domain.volume import Volume
from radserve.importers import ImportRefusedError
from radserve.importers.monai_bundle import import_monai, manifest_from_monai, read_bundle
from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
from radserve.models.manifest import MonaiIntensity, load_manifest

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _ct(shape: tuple[int, int, int], spacing: tuple[float, float, float]) -> Volume:
    from scipy import ndimage

    field = ndimage.gaussian_filter(np.random.default_rng(0).normal(size=shape), 2.0)
    hu = (50 + 1200 * field).astype(np.int16)
    return Volume.from_geometry(hu, spacing=spacing, origin=(10.0, -20.0, 30.0))


def _configs_only(bundle: str, folder: Path) -> Path:
    """The zoo bundle's files with an empty models/model.pt: the mapping and the
    refusals never read the weights."""
    mb.shutil.copytree(mb.ZOO / bundle, folder)
    (folder / "models").mkdir()
    (folder / "models" / "model.pt").write_bytes(b"")
    return folder


# bundle -> (network_def in place of the zoo's, or None for the zoo's own; CT shape, spacing
# (z, y, x) mm). Every model grid here is smaller than the 96^3 window on some axis, so
# the inferer's padding (zero, or replicate for wholeBody) is exercised.
IMPORTED: dict[str, tuple[dict[str, Any] | None, tuple[int, ...], tuple[float, ...]]] = {
    # the zoo's UNet as it is (4.8 M parameters)
    "spleen_ct_segmentation": (None, (40, 64, 72), (2.5, 0.9, 0.9)),
    # NormalizeIntensityd(nonzero) + ScaleIntensityd(-1, 1) on the model grid, replicate
    # window padding, argmax before a nearest Invertd; 105 classes kept, SegResNet
    # init_filters 8 instead of 32 (CI time)
    "wholeBody_ct_segmentation": (
        {
            "_target_": "SegResNet",
            "spatial_dims": 3,
            "in_channels": 1,
            "out_channels": 105,
            "init_filters": 8,
            "blocks_down": [1, 2, 2, 4],
            "blocks_up": [1, 1, 1],
            "dropout_prob": 0.2,
        },
        (40, 64, 72),
        (2.5, 0.9, 0.9),
    ),
    # ITKReader (dropped: radserve reads DICOM), CropForegroundd(mode minimum, margin 0:
    # MONAI never pads that box), CastToTyped float32, overlap 0.75; DynUNet with the
    # zoo's kernels and strides, filters 8..64 instead of 32..320 (CI time)
    "pediatric_abdominal_ct_segmentation": (
        {
            "_target_": "monai.networks.nets.DynUNet",
            "spatial_dims": 3,
            "in_channels": 1,
            "out_channels": 4,
            "kernel_size": [3, 3, 3, 3, 3, 3],
            "strides": [1, 2, 2, 2, 2, [2, 2, 1]],
            "upsample_kernel_size": [2, 2, 2, 2, [2, 2, 1]],
            "filters": [8, 16, 32, 64, 64, 64],
            "norm_name": "instance",
            "deep_supervision": False,
            "res_block": True,
        },
        (40, 64, 72),
        (2.5, 0.9, 0.9),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("bundle", list(IMPORTED))
def test_zoo_bundle_labels_agree_with_monai(tmp_path: Path, bundle: str) -> None:
    network, shape, spacing = IMPORTED[bundle]
    folder = mb.zoo_bundle(bundle, tmp_path / bundle, network=network)
    volume = _ct(shape, spacing)  # type: ignore[arg-type]
    want = mb.run_monai_reference(folder, mb.write_nifti(volume, tmp_path / "ct.nii.gz"))

    out = import_monai(folder, tmp_path / "models", name="zoo", version="1.0.0")
    spec = load_manifest(out / "model.yaml")
    got = run_task(PatchTask(volume, spec), ModelSession(out / "model.onnx", spec, runtime=CPU))

    assert got.labels.same_geometry(volume)
    counts = np.bincount(want.ravel(), minlength=len(spec.labels) + 1)
    assert (counts > 0.005 * want.size).sum() >= 2, counts  # not one class everywhere
    differ = int((got.labels.array != want).sum())
    agreement = 1.0 - differ / want.size
    print(f"{bundle}: agreement {agreement:.5f} ({differ} of {want.size} differ)")
    assert agreement >= 0.999, agreement


def test_whole_body_states_its_per_image_intensity(tmp_path: Path) -> None:
    """wholeBody_ct_segmentation's NormalizeIntensityd(nonzero) then ScaleIntensityd(-1, 1),
    after Spacingd, and its replicate window padding, as model.yaml states them."""
    folder = _configs_only("wholeBody_ct_segmentation", tmp_path / "b")
    spec = manifest_from_monai(read_bundle(folder), name="wb", version="1")
    norm = spec.input.normalisation
    assert isinstance(norm, MonaiIntensity)
    assert [(s.op, s.nonzero, s.minv, s.maxv) for s in norm.steps] == [
        ("normalize", True, 0.0, 1.0),
        ("scale", False, -1.0, 1.0),
    ]
    assert spec.input.resampling is not None and not spec.input.resampling.normalise_first
    assert spec.input.resampling.output_order == 0  # Invertd(nearest_interp=True)
    assert spec.input.sliding_window.pad == "centre_edge"
    assert spec.input.overlap == 0.25 and spec.input.batch_size == 1
    assert spec.input.spacing == (1.5, 1.5, 1.5) and len(spec.labels) == 104


# bundles whose preprocessing, inferer and postprocessing map, but whose network is not
# built in CI: (spacing, patch, overlap, labels, why)
MAPPED_ONLY = {
    # DiNTS: network_def loads the searched architecture with torch.load(map_location=
    # torch.device('cuda')) and a TopologyInstance on 'cuda': it builds on a CUDA host only
    "multi_organ_segmentation": ((1.0, 1.0, 1.0), (96, 96, 96), 0.625, 7),
    "pancreas_ct_dints_segmentation": ((1.0, 1.0, 1.0), (96, 96, 96), 0.625, 2),
    # UNesT from the bundle's scripts/ (imported by the importer): 87 M parameters with
    # embed dims fixed in its code, 14 CPU-s per 96^3 patch: built here, not run
    "renalStructures_UNEST_segmentation": ((1.0, 1.0, 1.0), (96, 96, 96), 0.5, 3),
}


@pytest.mark.parametrize("bundle", list(MAPPED_ONLY))
def test_zoo_bundle_mapping(tmp_path: Path, bundle: str) -> None:
    spacing, patch, overlap, labels = MAPPED_ONLY[bundle]
    folder = _configs_only(bundle, tmp_path / bundle)
    source = read_bundle(folder)
    spec = manifest_from_monai(source, name="zoo", version="1")
    assert spec.input.spacing == spacing and spec.input.patch_size == patch
    assert spec.input.overlap == overlap and len(spec.labels) == labels
    assert spec.input.normalisation.kind == "ct_window" and spec.input.axes == ("R", "A", "S")
    if bundle.startswith("renal"):
        from radserve.importers.monai_bundle import _parsed

        net = _parsed(source, "network_def")  # from the bundle's scripts/, as MONAI runs it
        assert type(net).__name__ == "UNesT" and "scripts" not in mb.sys.modules


REFUSED = {
    # AsDiscreted(argmax) first, then KeepLargestConnectedComponentd, a bilinear Invertd
    "prostate_mri_anatomy": "postprocessing\\[1\\] KeepLargestConnectedComponentd is not "
    "expressible",
    # its 4 channels (T1c, T1, T2, FLAIR) would map; its grid is the loader's
    "brats_mri_segmentation": "no Orientation\\(d\\)",
    # three phases stacked by the bundle's own transform (not shipped with the configs)
    "renalStructures_CECT_segmentation": "preprocessing\\[4\\] scripts.my_transforms.ConcatImages",
    "wholeBrainSeg_Large_UNEST_segmentation": "no Orientation\\(d\\)",
}


@pytest.mark.parametrize("bundle", list(REFUSED))
def test_zoo_bundle_refused_by_name(tmp_path: Path, bundle: str) -> None:
    folder = _configs_only(bundle, tmp_path / bundle)
    with pytest.raises(ImportRefusedError, match=REFUSED[bundle]):
        import_monai(folder, tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_swin_unetr_as_written_needs_its_removed_argument(tmp_path: Path) -> None:
    """The zoo's SwinUNETR network_def passes img_size, which MONAI 1.6 no longer takes:
    the import names MONAI's error (and MONAI's own run fails the same way)."""
    folder = _configs_only("swin_unetr_btcv_segmentation", tmp_path / "swin")
    with pytest.raises(ImportRefusedError, match=r"MONAI cannot build 'network_def'.*img_size"):
        import_monai(folder, tmp_path / "models")


SWIN_SMALL = {
    "_target_": "SwinUNETR",
    "spatial_dims": 3,
    "in_channels": 1,
    "out_channels": 14,
    "feature_size": 12,
    "use_checkpoint": False,
}


@pytest.mark.slow
def test_swin_unetr_refused_at_onnx_export(tmp_path: Path) -> None:
    """swin_unetr_btcv_segmentation's transforms map (spleen's shape, -175..250 HU), but
    torch 2.13's ONNX export of SwinUNETR (feature_size 12 here instead of 48, and
    without img_size) gives a graph ONNX Runtime rejects: refused naming the network,
    nothing left in the models folder."""
    folder = mb.zoo_bundle("swin_unetr_btcv_segmentation", tmp_path / "swin", network=SWIN_SMALL)
    spec = manifest_from_monai(read_bundle(folder), name="swin", version="1")
    assert spec.input.normalisation.kind == "ct_window" and len(spec.labels) == 13
    with pytest.raises(ImportRefusedError, match="network \\(SwinUNETR\\) does not export"):
        import_monai(folder, tmp_path / "models", name="swin", version="1")
    assert not (tmp_path / "models").exists()  # no version, no staging, no models folder


@pytest.mark.slow
def test_torchscript_model_ts_imports_like_model_pt(tmp_path: Path) -> None:
    """A bundle shipping ``models/model.ts`` (TorchScript, as the zoo's exports do) and no
    model.pt: imported from the TorchScript, its labels those of MONAI's run of the same
    weights (spleen_ct_segmentation's UNet)."""
    import torch

    folder = mb.zoo_bundle("spleen_ct_segmentation", tmp_path / "spleen")
    volume = _ct((40, 64, 72), (2.5, 0.9, 0.9))
    want = mb.run_monai_reference(folder, mb.write_nifti(volume, tmp_path / "ct.nii.gz"))
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(str(folder / "configs" / "inference.json"))
    net = parser.get_parsed_content("network_def")
    net.load_state_dict(torch.load(folder / "models" / "model.pt", weights_only=True))
    torch.jit.trace(net.eval(), torch.zeros(1, 1, 96, 96, 96)).save(folder / "models" / "model.ts")
    (folder / "models" / "model.pt").unlink()

    with pytest.raises(ImportRefusedError, match="--trust-torchscript"):
        import_monai(folder, tmp_path / "models", name="ts", version="1")
    assert not (tmp_path / "models").exists()
    out = import_monai(folder, tmp_path / "models", name="ts", version="1", trust_torchscript=True)
    assert "model.ts" in (out / "import.json").read_text()
    spec = load_manifest(out / "model.yaml")
    got = run_task(PatchTask(volume, spec), ModelSession(out / "model.onnx", spec, runtime=CPU))
    agreement = float((got.labels.array == want).mean())
    print(f"model.ts: agreement {agreement:.5f}")
    assert agreement >= 0.999, agreement


def test_brats_channels_map_and_its_sigmoid_regions_are_refused(tmp_path: Path) -> None:
    """brats_mri_segmentation with the Orientationd and Spacingd it lacks: its four
    channels (one key, T1c/T1/T2/FLAIR, NormalizeIntensityd(nonzero, channel_wise)) map
    to input.channels, and the import stops at what remains, its sigmoid regions."""
    import json

    folder = _configs_only("brats_mri_segmentation", tmp_path / "brats")
    config = folder / "configs" / "inference.json"
    cfg = json.loads(config.read_text())
    grid = [
        {"_target_": "Orientationd", "keys": "@image_key", "axcodes": "RAS"},
        {"_target_": "Spacingd", "keys": "@image_key", "pixdim": [1.0, 1.0, 1.0]},
    ]
    transforms = cfg["preprocessing"]["transforms"]
    cfg["preprocessing"]["transforms"] = [transforms[0], *grid, *transforms[1:]]
    config.write_text(json.dumps(cfg))
    with pytest.raises(ImportRefusedError, match=r"postprocessing\[0\] Activationsd: sigmoid"):
        manifest_from_monai(read_bundle(folder), name="brats", version="1")
