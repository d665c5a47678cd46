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


def metadata(channels: dict[str, str] | None = None, modality: str = "CT") -> dict[str, Any]:
    return {
        "name": "Tiny CT segmentation",
        "version": "0.1.0",
        "monai_version": "1.6.1",
        "network_data_format": {
            "inputs": {"image": {"type": "image", "modality": modality, "num_channels": 1}},
            "outputs": {
                "pred": {
                    "type": "image",
                    "num_channels": 3,
                    "channel_def": channels or {"0": "background", "1": "liver", "2": "spleen"},
                }
            },
        },
    }


def write_monai_bundle(folder: Path, *, seed: int = 0, **config: Any) -> Path:
    """A bundle at ``folder`` whose network has seeded random weights."""
    import torch
    from monai.bundle import ConfigParser

    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    cfg = inference_config(**config)
    (folder / "configs" / "inference.json").write_text(json.dumps(cfg, indent=2))
    (folder / "configs" / "metadata.json").write_text(json.dumps(metadata(), indent=2))
    parser = ConfigParser(cfg)
    torch.manual_seed(seed)
    net = parser.get_parsed_content("network_def")
    torch.save(net.state_dict(), folder / "models" / "model.pt")
    return folder


def write_nifti(volume: Volume, path: Path) -> Path:
    """``volume`` as NIfTI: (column, row, slice) array and its RAS affine."""
    import nibabel as nib

    affine = LPS_TO_RAS @ volume.affine[:, [2, 1, 0, 3]]
    nib.save(nib.Nifti1Image(volume.array.transpose(2, 1, 0).astype(np.float32), affine), path)
    return path


def run_monai_reference(bundle: Path, nifti: Path) -> np.ndarray:
    """MONAI's own run of the bundle on ``nifti``: labels in radserve's (z, y, x) order."""
    import torch
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_meta(str(bundle / "configs" / "metadata.json"))
    parser.read_config(str(bundle / "configs" / "inference.json"))
    parser["bundle_root"] = str(bundle)
    net = parser.get_parsed_content("network")
    net.load_state_dict(torch.load(bundle / "models" / "model.pt", weights_only=True))
    net.eval()
    pre = parser.get_parsed_content("preprocessing")
    inferer = parser.get_parsed_content("inferer")
    post = parser.get_parsed_content("postprocessing")
    data = pre({"image": str(nifti)})
    with torch.no_grad():
        data["pred"] = inferer(data["image"][None], net)[0]
    # SaveImaged would write a file: the check needs only the array
    post.transforms = tuple(t for t in post.transforms if type(t).__name__ != "SaveImaged")
    out = post(data)["pred"]
    return np.asarray(out[0]).transpose(2, 1, 0).astype(np.uint8)
