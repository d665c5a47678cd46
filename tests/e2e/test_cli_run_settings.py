"""``radserve run`` reads the settings (``--config``, ``RADSERVE_CONFIG``, ``RADSERVE_*``)
and ``--ingest NAME=VALUE``; its ingest errors name a setting or flag a user can set."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesions_hu
from tests.factories.server_process import run_radserve


def radserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``radserve ARGS`` with none of this environment's ``RADSERVE_*`` settings, and ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    return run_radserve(*args, env={**clean, **(env or {})})


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("run-settings")
    models, pipeline = write_test_bundles(root / "models"), write_test_pipeline(root)
    gap = root / "gap"  # one slice missing: ingest rejects it by default
    make_ct_series(
        gap, n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu, drop=(11,),
    )  # fmt: skip
    return {"root": root, "models": models, "pipeline": pipeline, "gap": gap}


def flags(setup: dict[str, Path]) -> list[str]:
    return ["--pipeline", str(setup["pipeline"]), "--models-dir", str(setup["models"])]


def resampled(out: Path) -> bool:
    report = json.loads((out / "report.json").read_text())
    return "resampled onto a regular" in json.dumps(report)


def test_the_ingest_error_names_the_setting_and_the_flag(setup, tmp_path: Path) -> None:
    done = radserve("run", str(setup["gap"]), *flags(setup), "--out", str(tmp_path / "o"))
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.split())  # the terminal wraps long lines
    assert "ingest.missing_slices: resample" in message
    assert "RADSERVE_INGEST__MISSING_SLICES=resample" in message
    assert "--ingest missing_slices=resample" in message
    assert "IngestPolicy(" not in message and "Traceback" not in message


def test_the_flag_the_error_names_works(setup, tmp_path: Path) -> None:
    out = tmp_path / "o"
    done = radserve(
        "run", str(setup["gap"]), *flags(setup), "--out", str(out), "--no-dicom",
        "--ingest", "missing_slices=resample",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert resampled(out)


@pytest.mark.parametrize("how", ["--config", "RADSERVE_CONFIG", "RADSERVE_INGEST__"])
def test_the_setting_the_error_names_works(setup, tmp_path: Path, how: str) -> None:
    config = tmp_path / "radserve.yaml"
    config.write_text(yaml.safe_dump({"ingest": {"missing_slices": "resample"}}))
    args = ["run", str(setup["gap"]), *flags(setup), "--out", str(tmp_path / "o"), "--no-dicom"]
    if how == "--config":
        done = radserve(*args, "--config", str(config))
    elif how == "RADSERVE_CONFIG":
        done = radserve(*args, env={"RADSERVE_CONFIG": str(config)})
    else:
        done = radserve(*args, env={"RADSERVE_INGEST__MISSING_SLICES": "resample"})
    assert done.returncode == 0, done.stderr
    assert resampled(tmp_path / "o")


def test_models_runtime_pipelines_and_results_come_from_the_settings(setup, tmp_path: Path) -> None:
    pipeline: Path = setup["pipeline"]
    config = tmp_path / "radserve.toml"
    config.write_text(
        f"[models]\ndirs = [{json.dumps(str(setup['models']))}]\n"
        f"[pipelines]\ndirs = [{json.dumps(str(pipeline.parent))}]\n"
        f"default = {json.dumps(pipeline.stem)}\n"
        '[runtime]\nproviders = ["CPUExecutionProvider"]\nthreads = 1\n'
        "[results]\nsecondary_capture_key_images = true\n"
        '[ingest]\nmissing_slices = "resample"\n'
    )
    out = tmp_path / "o"
    # no --pipeline, no --models-dir: both from the file; --ingest overrides the file
    done = radserve(
        "run", str(setup["gap"]), "--config", str(config), "--out", str(out),
        "--ingest", "missing_slices=flag",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["runtime"]["providers"] == ["CPUExecutionProvider"]
    assert "slice positions are approximate" in json.dumps(report) and not resampled(out)
    assert sorted(out.glob("keyimage-*-sc.dcm")), "results.secondary_capture_key_images"
    # and a flag turns the file's choice off again
    off = tmp_path / "off"
    done = radserve(
        "run", str(setup["gap"]), "--config", str(config), "--out", str(off),
        "--no-sc-key-images", "--ingest", "missing_slices=flag",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not sorted(off.glob("keyimage-*-sc.dcm")) and (off / "measurements-sr.dcm").is_file()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("missing_slices=maybe", "ingest.missing_slices"),
        ("missing_slice=resample", "no ingest setting"),
        ("missing_slices", "not NAME=VALUE"),
    ],
)
def test_a_bad_ingest_flag_is_one_clear_line(
    setup, tmp_path: Path, value: str, expected: str
) -> None:
    done = radserve(
        "run", str(setup["gap"]), *flags(setup), "--out", str(tmp_path / "o"), "--ingest", value
    )
    assert done.returncode == 2
    assert expected in done.stderr and "Traceback" not in done.stderr


def test_run_serves_what_models_install_put_in_the_configs_data_dir(setup, tmp_path: Path) -> None:
    """A user trial (session 42): `radserve models install B --config C` then `radserve
    run STUDY --config C` answered "unknown model" (run read only --models-dir,
    models.dirs and the shipped bundles, not C's data dir, which the server serves)."""
    config = tmp_path / "radserve.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    for name in ("organs-test", "lesions-test"):
        bundle = setup["models"] / name / "1.0.0"
        done = radserve("models", "install", str(bundle), "--config", str(config))
        assert done.returncode == 0, done.stderr
    out = tmp_path / "o"
    done = radserve(
        "run", str(setup["gap"]), "--pipeline", str(setup["pipeline"]), "--config", str(config),
        "--ingest", "missing_slices=resample", "--out", str(out), "--no-dicom",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "report.json").read_text())["findings"]  # the lesions found
