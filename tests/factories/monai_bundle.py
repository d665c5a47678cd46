"""A tiny MONAI Bundle built in the test: a real inference.json, random weights.

Laid out as MONAI's model zoo bundles are (spleen_ct_segmentation's inference.json
shape): ``configs/inference.json``, ``configs/metadata.json``, ``models/model.pt``.
``run_monai_reference`` runs it the way MONAI's bundle workflow does (preprocessing,
the SlidingWindowInferer over the network, postprocessing with Invertd), on a NIfTI
file written from a radserve volume.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from radserve.domain.volume import LPS_TO_RAS, Volume

PRE: list[dict[str, Any]] = [
    {"_target_": "LoadImaged", "keys": "image"},
    {"_target_": "EnsureChannelFirstd", "keys": "image"},
    {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
    {"_target_": "Spacingd", "keys": "image", "pixdim": [1.5, 1.5, 2.0], "mode": "bilinear"},
    {
        "_target_": "ScaleIntensityRanged",
        "keys": "image",
        "a_min": -57,
        "a_max": 164,
        "b_min": 0.0,
        "b_max": 1.0,
        "clip": True,
    },
    {"_target_": "EnsureTyped", "keys": "image"},
]
# spleen_ct_segmentation's CropForegroundd (default select_fn x > 0, margin 0)
CROP: dict[str, Any] = {"_target_": "CropForegroundd", "keys": "image", "source_key": "image"}


def cropped_pre(**options: Any) -> list[dict[str, Any]]:
    """PRE with ``CropForegroundd(**options)`` after ``ScaleIntensityRanged``, in
    spleen_ct_segmentation's place."""
    return [*PRE[:5], {**CROP, **options}, PRE[5]]


POST: list[dict[str, Any]] = [
    {"_target_": "Activationsd", "keys": "pred", "softmax": True},
    {
        "_target_": "Invertd",
        "keys": "pred",
        "transform": "@preprocessing",
        "orig_keys": "image",
        "nearest_interp": False,
        "to_tensor": True,
    },
    {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
    {"_target_": "SaveImaged", "keys": "pred", "output_dir": "@output_dir", "resample": False},
]
NETWORK: dict[str, Any] = {
    "_target_": "UNet",
    "spatial_dims": 3,
    "in_channels": 1,
    "out_channels": 3,
    "channels": [8, 16, 32],
    "strides": [2, 2],
    "num_res_units": 1,
    "norm": "batch",
}
# Multi-sequence MR (T1, T2, FLAIR on one grid), stacked by the loader one of MONAI's two
# ways: several keys joined by ConcatItemsd, or one key given a list of files (BraTS's)
SEQUENCE_KEYS = ["t1", "t2", "flair"]
_MR_TAIL: list[dict[str, Any]] = [
    {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
    {"_target_": "Spacingd", "keys": "image", "pixdim": [4.0, 4.0, 6.0], "mode": "bilinear"},
    {"_target_": "NormalizeIntensityd", "keys": "image", "nonzero": True, "channel_wise": True},
    {"_target_": "EnsureTyped", "keys": "image"},
]
MR_CONCAT_PRE: list[dict[str, Any]] = [
    {"_target_": "LoadImaged", "keys": SEQUENCE_KEYS},
    {"_target_": "EnsureChannelFirstd", "keys": SEQUENCE_KEYS},
    {"_target_": "ConcatItemsd", "keys": SEQUENCE_KEYS, "name": "image", "dim": 0},
    *_MR_TAIL,
]
MR_LIST_PRE: list[dict[str, Any]] = [
    {"_target_": "LoadImaged", "keys": "image"},
    {"_target_": "EnsureChannelFirstd", "keys": "image"},
    *_MR_TAIL,
]
MR_NETWORK: dict[str, Any] = {**NETWORK, "in_channels": 3}
INFERER: dict[str, Any] = {
    "_target_": "SlidingWindowInferer",
    "roi_size": [32, 32, 32],
    "sw_batch_size": 4,
    "overlap": 0.5,
    "mode": "gaussian",
    "sigma_scale": 0.125,
}


def inference_config(
    *,
    pre: list[dict[str, Any]] | None = None,
    post: list[dict[str, Any]] | None = None,
    network: dict[str, Any] | None = None,
    inferer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "imports": ["$import glob", "$import os"],
        "bundle_root": ".",
        "output_dir": "$@bundle_root + '/eval'",
        "device": "$torch.device('cpu')",
        "network_def": copy.deepcopy(network or NETWORK),
        "network": "$@network_def.to(@device)",
        "preprocessing": {"_target_": "Compose", "transforms": copy.deepcopy(pre or PRE)},
        "inferer": copy.deepcopy(inferer or INFERER),
        "postprocessing": {"_target_": "Compose", "transforms": copy.deepcopy(post or POST)},
    }


def metadata(
    channels: dict[str, str] | None = None,
    modality: str = "CT",
    inputs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``inputs``: the input's ``channel_def`` (several channels), else one channel."""
    image: dict[str, Any] = {"type": "image", "modality": modality, "num_channels": 1}
    if inputs is not None:
        image.update(num_channels=len(inputs), channel_def=inputs)
    return {
        "name": "Tiny CT segmentation",
        "version": "0.1.0",
        "monai_version": "1.6.1",
        "network_data_format": {
            "inputs": {"image": image},
            "outputs": {
                "pred": {
                    "type": "image",
                    "num_channels": 3,
                    "channel_def": channels or {"0": "background", "1": "liver", "2": "spleen"},
                }
            },
        },
    }


def write_monai_bundle(
    folder: Path, *, seed: int = 0, meta: dict[str, Any] | None = None, **config: Any
) -> Path:
    """A bundle at ``folder`` whose network has seeded random weights (``meta``:
    metadata.json, default :func:`metadata`)."""
    import torch
    from monai.bundle import ConfigParser

    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    cfg = inference_config(**config)
    (folder / "configs" / "inference.json").write_text(json.dumps(cfg, indent=2))
    (folder / "configs" / "metadata.json").write_text(json.dumps(meta or metadata(), indent=2))
    parser = ConfigParser(cfg)
    torch.manual_seed(seed)
    net = parser.get_parsed_content("network_def")
    torch.save(net.state_dict(), folder / "models" / "model.pt")
    return folder


ZOO = Path(__file__).parents[1] / "data" / "monai_zoo"
"""MONAI Model Zoo bundles' configs as the zoo ships them (tests/data/monai_zoo/README.md)."""


def zoo_bundle(
    name: str, folder: Path, *, network: dict[str, Any] | None = None, seed: int = 0
) -> Path:
    """The zoo bundle ``name`` at ``folder``: its configs (and scripts/) as shipped, with
    ``network_def`` replaced by ``network`` where given (a smaller variant of the same
    class), and seeded random weights for it in ``models/model.pt``."""
    import torch
    import yaml
    from monai.bundle import ConfigParser

    shutil.copytree(ZOO / name, folder)
    (folder / "models").mkdir()
    config = next(folder.glob("configs/inference.*"))
    if network is not None:
        is_json = config.suffix == ".json"
        cfg = json.loads(config.read_text()) if is_json else yaml.safe_load(config.read_text())
        cfg["network_def"] = network
        config.write_text(json.dumps(cfg, indent=2) if is_json else yaml.safe_dump(cfg))
    parser = ConfigParser()
    parser.read_config(str(config))
    parser["bundle_root"] = str(folder)
    torch.manual_seed(seed)
    sys.path.insert(0, str(folder))
    try:
        net = parser.get_parsed_content("network_def")
    finally:
        sys.path.remove(str(folder))
    torch.save(net.state_dict(), folder / "models" / "model.pt")
    return folder


# The CT the MONAI serve cases send (tests/e2e/test_imported_model_serve.py; its crop
# case measured step by step by tools/measure_monai_class_ties.py): its grid and HU.
SERVED_SHAPE, SERVED_SPACING, SERVED_ORIGIN = (24, 64, 64), (2.5, 1.2, 1.2), (-38.0, -40.0, 5.0)


def served_hu(*, air: bool) -> np.ndarray:
    """HU at SERVED_SHAPE (SERVED_SPACING, SERVED_ORIGIN); ``air``: air beside the body
    and in the first slices (1.2 -> 1.5 mm ties at the crop box)."""
    from scipy import ndimage

    field = ndimage.gaussian_filter(np.random.default_rng(7).normal(size=SERVED_SHAPE), 2.0)
    hu = np.clip(np.round(50 + 1200 * field), -1024, 3071)
    if air:
        hu[:, :, :3] = -1000.0
        hu[:2] = -1000.0
    return hu


def write_nifti(volume: Volume, path: Path) -> Path:
    """``volume`` as NIfTI: (column, row, slice) array and its RAS affine."""
    import nibabel as nib

    affine = LPS_TO_RAS @ volume.affine[:, [2, 1, 0, 3]]
    nib.save(nib.Nifti1Image(volume.array.transpose(2, 1, 0).astype(np.float32), affine), path)
    return path


@dataclass(frozen=True)
class MonaiRun:
    """MONAI's own run of a bundle: its labels, and the class scores its
    ``AsDiscreted(argmax)`` took (``(k, z, y, x)``; None when the argmax is not the last
    step, e.g. before a nearest ``Invertd``), both in radserve's (z, y, x) order."""

    labels: np.ndarray
    scores: np.ndarray | None


def run_monai_bundle(bundle: Path, nifti: Path | dict[str, Any], network: Any = None) -> MonaiRun:
    """MONAI's own run of the bundle on ``nifti`` (or the data dictionary the loader
    reads, e.g. ``{"t1": ..., "t2": ...}`` or ``{"image": [t1, t2]}``), as its bundle
    workflow runs it (``network``: a callable run in place of the bundle's torch network)."""
    import torch
    from monai.bundle import ConfigParser

    from radserve.importers.monai_bundle import without_file_readers

    config = next(bundle.glob("configs/inference.*"))
    parser = ConfigParser()
    parser.read_meta(str(bundle / "configs" / "metadata.json"))
    parser.read_config(str(config))
    parser["bundle_root"] = str(bundle)
    # LoadImaged(reader="ITKReader") needs itk, not installed here: MONAI picks its reader
    # for the NIfTI (nibabel), the same array and affine
    without_file_readers(parser)
    sys.path.insert(0, str(bundle))  # the bundle's scripts/, as `monai.bundle run` has it
    try:
        net = parser.get_parsed_content("network")
        pre = parser.get_parsed_content("preprocessing")
        inferer = parser.get_parsed_content("inferer")
        post = parser.get_parsed_content("postprocessing")
    finally:
        sys.path.remove(str(bundle))
    net.load_state_dict(torch.load(bundle / "models" / "model.pt", weights_only=True))
    net.eval()
    data = pre(nifti if isinstance(nifti, dict) else {"image": str(nifti)})
    with torch.no_grad():
        data["pred"] = inferer(data["image"][None], network or net)[0]
    # SaveImaged would write a file: the check needs only the array
    steps = [t for t in post.transforms if type(t).__name__ != "SaveImaged"]
    scores = None
    for i, step in enumerate(steps):
        if type(step).__name__ == "AsDiscreted" and i == len(steps) - 1:
            scores = np.asarray(data["pred"]).transpose(0, 3, 2, 1).astype(np.float32)
        data = step(data)
    labels = np.asarray(data["pred"][0]).transpose(2, 1, 0).astype(np.uint8)
    return MonaiRun(labels, scores)


def run_monai_reference(bundle: Path, nifti: Path) -> np.ndarray:
    """MONAI's own run of the bundle on ``nifti``: labels in radserve's (z, y, x) order."""
    return run_monai_bundle(bundle, nifti).labels


def float_ties(scores: np.ndarray, rel: float = 1e-6) -> np.ndarray:
    """Voxels whose two leading class scores are within ``rel`` of the leading one (a
    float32 ulp is 6e-8 of it): there the argmax follows the last bits of the scores,
    which MONAI's own run changes with torch's thread count (docs/model-ops.md). Voxels
    whose scores are all 0 (outside a CropForeground box) are not ties: the label there
    is decided exactly."""
    top = np.sort(scores, axis=0)[-2:].astype(np.float64)
    return (top[1] > 0) & (top[1] - top[0] <= rel * top[1])
