"""nnU-Net folders for tests: the benchmark's own factory (one definition), and plans
written by nnU-Net's own experiment planners (:func:`planner_plans`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from radserve.bench.nnunet_model import (
    CONFIG,
    FOLDER,
    default_ct_plans,
    make_results_folder,
    tiny_dataset,
    tiny_plans,
)

__all__ = [
    "CONFIG",
    "FOLDER",
    "default_ct_plans",
    "make_results_folder",
    "planner_plans",
    "tiny_dataset",
    "tiny_plans",
]

_PLAN = """
import sys
import SimpleITK as sitk, numpy as np
from nnunetv2.utilities.find_class_by_name import recursive_find_python_class
import nnunetv2, os
root = os.path.join(nnunetv2.__path__[0], "experiment_planning")
cls = recursive_find_python_class(root, sys.argv[1], "nnunetv2.experiment_planning")
cls(int(sys.argv[2])).plan_experiment()
"""


def planner_plans(
    work: Path,
    planner: str = "nnUNetPlannerResEncM",
    *,
    median_shape: tuple[int, int, int] = (16, 32, 32),
    spacing: tuple[float, float, float] = (2.0, 1.5, 1.5),
    dataset: dict | None = None,
) -> dict:
    """The plans nnU-Net's ``planner`` (a class name: ``ExperimentPlanner``,
    ``nnUNetPlannerResEncM``, ``nnUNetPlannerResEncL``, ...) writes for a dataset whose
    fingerprint says every case is ``median_shape`` voxels at ``spacing`` (z, y, x) with
    CT intensities (:func:`tiny_plans`' percentiles): a small median makes a small
    network (the planner's patch never exceeds the median image).

    Run in a child process: nnU-Net reads ``nnUNet_raw`` / ``nnUNet_preprocessed`` from
    the environment when it is imported. The planner opens one training image (to pick
    its reader) and reads ``dataset_fingerprint.json``; both are written here."""
    import numpy as np
    import SimpleITK as sitk

    name = "Dataset901_Tiny"
    raw, pre = work / "raw" / name, work / "preprocessed" / name
    (raw / "imagesTr").mkdir(parents=True)
    (raw / "labelsTr").mkdir()
    pre.mkdir(parents=True)
    dataset = dataset or tiny_dataset()
    (raw / "dataset.json").write_text(json.dumps({**dataset, "numTraining": 1}))
    image = sitk.GetImageFromArray(np.zeros(median_shape, np.float32))
    image.SetSpacing(tuple(float(s) for s in reversed(spacing)))
    channels = len(dataset["channel_names"])
    for c in range(channels):
        sitk.WriteImage(image, str(raw / "imagesTr" / f"case_000_{c:04d}.nii.gz"))
    sitk.WriteImage(sitk.Cast(image, sitk.sitkUInt8), str(raw / "labelsTr" / "case_000.nii.gz"))
    props = tiny_plans(channels=channels)["foreground_intensity_properties_per_channel"]
    fingerprint = {
        "foreground_intensity_properties_per_channel": props,
        "median_relative_size_after_cropping": 1.0,
        "shapes_after_crop": [list(median_shape)] * 2,
        "spacings": [list(spacing)] * 2,
    }
    (pre / "dataset_fingerprint.json").write_text(json.dumps(fingerprint))
    env = {
        **os.environ,
        "nnUNet_raw": str(work / "raw"),
        "nnUNet_preprocessed": str(work / "preprocessed"),
        "nnUNet_results": str(work / "results"),
    }
    subprocess.run(
        [sys.executable, "-c", _PLAN, planner, "901"], env=env, capture_output=True, check=True
    )
    (written,) = (
        p for p in pre.glob("*.json") if p.name not in ("dataset_fingerprint.json", "dataset.json")
    )
    return json.loads(written.read_text())
