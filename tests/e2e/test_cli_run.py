"""``radserve run`` as a user calls it: exit status, report folder, DICOM results, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series, write_not_dicom
from tests.factories.results import lesions_hu


def _radserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from radserve.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    return write_test_bundles(root / "models"), write_test_pipeline(root)


def test_run_writes_report_label_maps_and_dicom(bundles, tmp_path: Path) -> None:
    models, pipeline = bundles
    make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    out = tmp_path / "out"
    done = _radserve(
        "run", str(tmp_path / "study"), "--pipeline", str(pipeline), "--out", str(out),
        "--models-dir", str(models),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert str(out / "report.json") in done.stdout.replace("\n", "")  # rich wraps long paths
    assert report["findings"], "the bright spheres are findings"
    for name in ("organs.nii.gz", "findings.nii.gz", "measurements-sr.dcm", "findings-seg.dcm"):
        assert (out / name).is_file(), name


def test_not_dicom_is_one_clear_line_and_exit_2(bundles, tmp_path: Path) -> None:
    models, pipeline = bundles
    write_not_dicom(tmp_path / "study" / "notes.txt")
    done = _radserve(
        "run", str(tmp_path / "study"), "--pipeline", str(pipeline), "--out", str(tmp_path / "o"),
        "--models-dir", str(models),
    )  # fmt: skip
    assert done.returncode == 2
    assert "error [not_dicom]" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_pipeline_names_the_available_ones(tmp_path: Path) -> None:
    make_ct_series(tmp_path / "study", n_slices=4)
    done = _radserve("run", str(tmp_path / "study"), "--pipeline", "ct-chest", "--out", "x")
    assert done.returncode == 2
    assert "unknown pipeline 'ct-chest'" in done.stderr and "ct-chest-abdomen" in done.stderr


def test_provider_choice_reaches_the_report_and_a_missing_one_is_refused(
    bundles, tmp_path: Path
) -> None:
    models, pipeline = bundles
    make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    common = ("--pipeline", str(pipeline), "--models-dir", str(models), "--no-dicom")
    done = _radserve(
        "run", str(tmp_path / "study"), *common, "--out", str(tmp_path / "cpu"),
        "--provider", "CPUExecutionProvider",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "cpu" / "report.json").read_text())
    assert report["runtime"]["providers"] == ["CPUExecutionProvider"]
    done = _radserve(
        "run", str(tmp_path / "study"), *common, "--out", str(tmp_path / "gpu"),
        "--provider", "CUDAExecutionProvider",
    )  # fmt: skip
    assert done.returncode == 2
    assert "CUDAExecutionProvider" in done.stderr and "were asked for" in done.stderr
    assert "Traceback" not in done.stderr
