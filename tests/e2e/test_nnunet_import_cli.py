"""An nnU-Net folder imported from the CLI and served by ``radserve run`` on a DICOM CT.

The labels ``radserve run`` writes (organs.nii.gz, DICOM SEG) are compared with
``nnUNetPredictor`` on the same CT and weights; the folder is made in the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nnunetv2", reason="the nnunet extra is not installed")

from tests.factories.dicom_series import make_ct_series
from tests.factories.nnunet_folder import make_results_folder
from tests.integration.test_nnunet_agreement import synthetic_ct

from radserve.importers.nnunet import load_predictor, read_results_folder
from radserve.ingest.nifti import load_nifti


def _radserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from radserve.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
def test_imported_model_serves_through_radserve_run(tmp_path: Path) -> None:
    folder = make_results_folder(tmp_path / "results", folds=(0,), spacing=(4.0, 2.5, 2.5))
    models = tmp_path / "models"
    done = _radserve("models", "import", "nnunet", str(folder), "--models-dir", str(models),
                     "--name", "tiny-ct")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (models / "tiny-ct" / "1.0.0" / "model.onnx").is_file()
    # A second import of the same version is refused, not overwritten.
    again = _radserve("models", "import", "nnunet", str(folder), "--models-dir", str(models),
                      "--name", "tiny-ct")  # fmt: skip
    assert again.returncode != 0 and "already holds a bundle" in again.stderr

    ct = synthetic_ct((20, 64, 64), seed=5)
    ct[ct == 0] = -1000.0  # DICOM CT: air outside the field of view
    ct = np.clip(np.round(ct), -1024, 3071)
    make_ct_series(tmp_path / "study", n_slices=20, rows=64, cols=64, spacing=(3.0, 2.0, 2.0),
                   hu=ct)  # fmt: skip
    pipeline = tmp_path / "tiny.yaml"
    pipeline.write_text(
        "name: tiny-nnunet\nversion: 1.0.0\nseries_selection: {modalities: [CT]}\n"
        "steps:\n  - model: tiny-ct\n"
    )
    out = tmp_path / "out"
    done = _radserve("run", str(tmp_path / "study"), "--pipeline", str(pipeline), "--out",
                     str(out), "--models-dir", str(models), "--no-key-images")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["tiny-ct"]
    assert (out / "tiny-ct-seg.dcm").is_file()
    labels = load_nifti(out / "tiny-ct.nii.gz")
    volume = labels  # on the grid of the CT radserve loaded
    assert labels.shape == (20, 64, 64)
    predictor = load_predictor(read_results_folder(folder))
    theirs = predictor.predict_single_npy_array(
        ct[None].astype(np.float32), {"spacing": list(volume.spacing)}
    )
    assert len(np.unique(theirs)) >= 2
    # radserve's post-processing (no min size, no keep-largest declared) leaves labels as is.
    assert float((labels.array == theirs).mean()) >= 0.999
