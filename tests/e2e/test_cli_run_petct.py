"""``radserve run`` on a PET/CT phantom study with a two-channel model, and with a PET-only
model: a DICOM SEG out, on the series each model reads as its grid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pydicom
import pytest
from tests.factories.petct import (
    seg_references,
    write_pet_only_bundle,
    write_pet_only_pipeline,
    write_petct_bundle,
    write_petct_pipeline,
)
from tests.factories.server_process import run_radserve


@pytest.fixture(scope="module")
def petct(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("petct")
    done = run_radserve("phantom", "--seed", "0", "--small", "--pet", "--out", str(root / "study"))
    assert done.returncode == 0, done.stderr
    return root / "study" / "dicom", write_petct_bundle(root / "models"), write_petct_pipeline(root)


def _run(study: Path, pipeline: Path, models: Path, out: Path) -> tuple[dict, pydicom.Dataset]:
    """``radserve run`` of ``pipeline``: its report and its SEG of the hot lesions."""
    done = run_radserve(
        "run", str(study), "--pipeline", str(pipeline), "--out", str(out),
        "--models-dir", str(models), "--no-key-images",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["findings"], "the hot lesions are findings"
    return report, pydicom.dcmread(out / "hot_lesions-seg.dcm")


def _uids(study: Path, pattern: str) -> set[str]:
    return {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID for p in study.glob(pattern)}


def test_run_on_pet_ct_writes_a_seg_of_the_hot_lesions(petct, tmp_path: Path) -> None:
    study, models, pipeline = petct
    report, seg = _run(study, pipeline, models, tmp_path / "out")
    assert report["series_selection"]["rejected"] == []
    assert seg.Modality == "SEG"
    assert seg.SegmentSequence[0].SegmentLabel
    ct_uids = _uids(study, "CT*.dcm")
    referenced = seg_references(seg)
    assert referenced and referenced <= ct_uids, "the SEG lies on the CT (the reference grid)"


def test_run_without_the_pet_fails_with_one_clear_line(petct, tmp_path: Path) -> None:
    study, models, pipeline = petct
    ct_only = tmp_path / "ct"
    ct_only.mkdir()
    for path in study.glob("CT*.dcm"):
        shutil.copy(path, ct_only)
    done = run_radserve(
        "run", str(ct_only), "--pipeline", str(pipeline), "--out", str(tmp_path / "o"),
        "--models-dir", str(models),
    )  # fmt: skip
    assert done.returncode == 2
    assert "error [channel_series_unavailable]" in done.stderr
    assert "channel 'pet' from a PT series" in done.stderr
    assert "Traceback" not in done.stderr


def test_run_with_a_pet_only_model_writes_a_seg_on_the_pet(petct, tmp_path: Path) -> None:
    study, _models, _pipeline = petct
    models = write_pet_only_bundle(tmp_path / "models")
    pipeline = write_pet_only_pipeline(tmp_path)
    report, seg = _run(study, pipeline, models, tmp_path / "out")
    assert report["series_selection"]["selected"]["modality"] == "PT"
    pt_uids, referenced = _uids(study, "PT*.dcm"), seg_references(seg)
    assert referenced and referenced <= pt_uids, "the SEG lies on the PET (its grid)"
