"""``radserve run`` and ``radserve phantom`` write their output folder whole or not at all
(2026-12-08, an imaging-IT engineer's first days with the command line).

``run`` into a folder holding an earlier run's results wrote this run's beside them
(``--no-dicom`` kept the other study's SEG and SR: another patient's objects under this
report), a run stopped with Ctrl-C after its report kept ``report.json`` without the SEG
and SR, two runs into one folder at once mixed their files, and the refusals of ``--out``
exited 1 where every other refusal exits 2. ``phantom`` into an existing folder left the
earlier phantom's slices in the series (``--slices 5`` after 24: 24 slices, a ground
truth of 5) and ``--out`` under a file was a NotADirectoryError traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesions_hu
from tests.factories.server_process import radserve_command, run_radserve


def _env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    return {**clean, "COLUMNS": "400"}


def radserve(*args: str) -> subprocess.CompletedProcess[str]:
    return run_radserve(*args, env=_env(), timeout=600)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("outputs-whole")
    models, pipeline = write_test_bundles(root / "models"), write_test_pipeline(root)
    studies = {}
    for name, origin in (("one", -20.0), ("two", -24.0)):
        studies[name] = root / name
        make_ct_series(
            studies[name], n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
            origin=(origin, origin, 0.0), hu=lesions_hu,
        )  # fmt: skip
    return {"models": models, "pipeline": pipeline, **studies}


def run_args(setup: dict[str, Path], study: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run", str(study), "--out", str(out), "--pipeline", str(setup["pipeline"]),
        "--models-dir", str(setup["models"]), *extra,
    ]  # fmt: skip


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_run_refuses_a_folder_that_holds_results_and_changes_nothing(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "results"
    first = radserve(*run_args(setup, setup["one"], out))
    assert first.returncode == 0, first.stderr
    assert (out / "report.json").is_file() and (out / "organs-seg.dcm").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "no staging left"
    before = _tree(out)
    # another study, without DICOM objects: the first study's SEG/SR stayed beside its report
    second = radserve(*run_args(setup, setup["two"], out, "--no-dicom"))
    assert second.returncode == 2, second.stderr
    [line] = second.stderr.strip().splitlines()
    assert line.startswith(f"Error: --out {out} already holds")
    assert "give a new or empty folder" in line
    assert _tree(out) == before


@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_run_refusing_its_out_exits_2(setup: dict[str, Path], tmp_path: Path, where: str) -> None:
    """As a refusal of what it was given (click's usage errors, phantom's --out): 2, not 1."""
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    out = blocker if where == "a-file" else blocker / "results"
    done = radserve(*run_args(setup, setup["one"], out))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_run_stopped_after_its_report_leaves_no_result(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    """Ctrl-C once the report is written (the SEG and SR still to come): nothing in --out
    looks finished; the folder this run created is gone again."""
    out = tmp_path / "stopped"
    process = subprocess.Popen(
        radserve_command(*run_args(setup, setup["one"], out)),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out.exists() and any(out.rglob("report.json"))):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "no report.json within 300 s"
            time.sleep(0.005)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))


def test_two_runs_into_one_folder_at_once_do_not_mix(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "shared"
    processes = [
        subprocess.Popen(
            radserve_command(*run_args(setup, setup[name], out, *extra)),
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, extra in (("one", ()), ("two", ("--no-dicom",)))
    ]
    results = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in processes]
    assert sorted(code for code, _ in results) in ([0, 1], [0, 2]), results
    [(_, refused)] = [(code, err) for code, err in results if code != 0]
    assert "Traceback" not in refused
    study = json.loads((out / "report.json").read_text())["study"]["study_instance_uid"]
    dicoms = sorted(out.glob("*.dcm"))
    winner = "two" if not dicoms else "one"
    assert study == _study_uid(setup[winner])
    for path in dicoms:
        assert _study_uid_of(path) == study


def _study_uid(folder: Path) -> str:
    return _study_uid_of(sorted(folder.glob("*.dcm"))[0])


def _study_uid_of(path: Path) -> str:
    from pydicom import dcmread

    return str(dcmread(path, stop_before_pixels=True).StudyInstanceUID)


def test_phantom_refuses_a_folder_holding_a_phantom(tmp_path: Path) -> None:
    out = tmp_path / "phantom"
    made = radserve("phantom", "--seed", "3", "--small", "--slices", "24", "--out", str(out))
    assert made.returncode == 0, made.stderr
    before = _tree(out)
    again = radserve("phantom", "--seed", "3", "--small", "--slices", "5", "--out", str(out))
    assert again.returncode == 2, again.stderr
    assert f"--out {out} already holds" in again.stderr
    assert _tree(out) == before and len(list((out / "dicom").iterdir())) == 24


def test_phantom_under_a_file_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    done = radserve("phantom", "--seed", "3", "--small", "--out", str(blocker / "phantom"))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and f"{blocker} is a file" in done.stderr
    assert blocker.read_text() == "not a folder"
