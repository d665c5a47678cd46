"""NIfTI and JSON ground truth for phantoms (what training and evaluation read)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from radserve.domain.volume import Volume
from radserve.ingest.nifti import save_nifti
from radserve.phantom.generate import Phantom
from radserve.phantom.spec import ORGAN_LABELS

logger = logging.getLogger(__name__)


def write_nifti(volume: Volume, path: str | Path) -> Path:
    """Write ``volume`` as NIfTI-1 (RAS affine; array transposed to column, row, slice).

    Read it back with ``radserve.ingest.load_nifti``. The dtype is kept (int16 HU,
    uint8 organs, uint16 lesions), without scaling.
    """
    return save_nifti(volume, path)


def ground_truth(phantom: Phantom) -> dict[str, object]:
    """JSON-ready description: spec, organ label values and the lesion list."""
    return {
        "seed": phantom.spec.seed,
        "spec": dataclasses.asdict(phantom.spec),
        "organ_labels": dict(ORGAN_LABELS),
        "frame_of_reference_uid": phantom.ct.frame_of_reference_uid,
        "shape": list(phantom.ct.shape),
        "affine": phantom.ct.affine.tolist(),
        "slice_indices": list(phantom.slice_indices),
        "lesions": [lesion.to_dict() for lesion in phantom.lesion_list],
    }


def write_ground_truth(phantom: Phantom, out_dir: str | Path) -> dict[str, Path]:
    """Write labels.nii.gz (organs), lesions.nii.gz and lesions.json into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "labels": write_nifti(phantom.organs, out / "labels.nii.gz"),
        "lesions": write_nifti(phantom.lesions, out / "lesions.nii.gz"),
        "json": out / "lesions.json",
    }
    paths["json"].write_text(json.dumps(ground_truth(phantom), indent=2) + "\n")
    logger.info("wrote phantom ground truth (%d lesions)", len(phantom.lesion_list))
    return paths
