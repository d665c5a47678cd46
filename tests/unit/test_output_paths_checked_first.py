"""``radserve plan`` and ``radserve bench`` check where they will write before they
simulate or run anything: one usage error line, exit 2, no traceback.

Probe of 2026-12-06: ``radserve plan --plot /sys/tat.svg`` simulated the whole load and
then ended in a PermissionError traceback; ``radserve bench --json <a folder>`` ran the
whole benchmark and then ended in an IsADirectoryError traceback. The real command, in a
fresh interpreter, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from tests.factories.server_process import run_radserve

# nobody, root included, creates a file here (a virtual file system)
UNWRITABLE = Path("/proc/radserve-test-output")


def radserve(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    return run_radserve(*args, env={**clean, "COLUMNS": "400"}, timeout=timeout)


def _one_line_usage_error(done: subprocess.CompletedProcess[str], option: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"'{option}'" in errors[0], done.stderr
    return errors[0]


def _read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write in: /proc for root (permissions do not stop
    it), else a folder without write permission."""
    if os.geteuid() == 0:
        return Path("/proc")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


@pytest.mark.parametrize("name", ["tat.svg", "tat.html", "tat.png"])
def test_plan_refuses_an_unwritable_plot_before_simulating(tmp_path: Path, name: str) -> None:
    # ~200,000 arrivals: the old code simulated them all before failing at the write
    args = ["plan", "--rate", "urgent=60/h,outpatient=600/h", "--hours", "300"]
    started = time.monotonic()
    done = radserve(
        *args, "--plot", str(_read_only_folder(tmp_path) / name), "--data-dir", str(tmp_path),
        timeout=120,
    )  # fmt: skip
    line = _one_line_usage_error(done, "--plot")
    assert "cannot write" in line
    assert done.stdout == ""  # nothing simulated, nothing reported
    assert time.monotonic() - started < 60


def test_plan_refuses_a_plot_path_that_is_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "out.svg"
    folder.mkdir()
    done = radserve(
        "plan", "--rate", "urgent=20/h", "--hours", "1", "--plot", str(folder),
        "--data-dir", str(tmp_path), timeout=120,
    )  # fmt: skip
    _one_line_usage_error(done, "--plot")


def test_plan_writes_a_writable_plot(tmp_path: Path) -> None:
    plot = tmp_path / "tat.svg"
    done = radserve(
        "plan", "--rate", "urgent=20/h", "--hours", "1", "--plot", str(plot),
        "--data-dir", str(tmp_path), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert plot.read_text().startswith("<svg")


@pytest.mark.parametrize("scenario", ["pipeline", "eta", "critical"])
def test_bench_refuses_a_json_folder_before_running(tmp_path: Path, scenario: str) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    # the old code ran the whole benchmark first (minutes): the timeout fails it
    done = radserve("bench", "--scenario", scenario, "--json", str(folder), timeout=60)
    line = _one_line_usage_error(done, "--json")
    assert "folder" in line
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    "where",
    [
        lambda tmp: _read_only_folder(tmp) / "bench.json",
        lambda tmp: _read_only_folder(tmp) / "new" / "bench.json",  # parents made later
        lambda tmp: Path("/etc/hostname/bench.json"),  # a file where a folder must be
    ],
    ids=["unwritable", "unwritable-parent", "under-a-file"],
)
def test_bench_refuses_an_unwritable_json_before_running(tmp_path: Path, where) -> None:  # type: ignore[no-untyped-def]
    path = where(tmp_path)
    done = radserve("bench", "--json", str(path), timeout=60)
    _one_line_usage_error(done, "--json")
    assert not path.exists()


def test_bench_refuses_a_cache_dir_that_is_a_file_before_running(tmp_path: Path) -> None:
    afile = tmp_path / "cache"
    afile.write_text("x")
    done = radserve("bench", "--cache-dir", str(afile), timeout=60)
    _one_line_usage_error(done, "--cache-dir")
    assert afile.read_text() == "x"
