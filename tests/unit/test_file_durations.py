"""The per-file ranking that ``make test`` prints (tests/file_durations.py), run on a
throw-away suite of two files in a child pytest."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _pytest(folder: Path, *args: str) -> str:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "tests.file_durations", "--rootdir", str(folder), *args, str(folder)]
    done = subprocess.run(
        command,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_with_durations_the_files_are_ranked_with_their_tests_and_the_suite_total(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_waits.py").write_text(
        "import time\n\ndef test_one():\n    time.sleep(1.0)\n\ndef test_two():\n    pass\n"
    )
    (tmp_path / "test_quick.py").write_text("def test_a():\n    pass\n")
    out = _pytest(tmp_path, "--durations=5", "--file-durations=1")
    table = out[out.index("slowest 1 test files") :]
    rows = re.findall(r"^\s*([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\S+)$", table, re.M)
    assert [(tests, name) for _, _, tests, name in rows] == [("2", "test_waits.py")]
    assert float(rows[0][0]) >= 1.0  # it slept a second: at least that much wall
    assert re.search(r"^suite: 2 files, 3 tests; test phases [\d.]+ s wall", table, re.M)
    assert out.index("slowest 5 durations") < out.index("slowest 1 test files")


def test_without_durations_nothing_is_added(tmp_path: Path) -> None:
    (tmp_path / "test_quick.py").write_text("def test_a():\n    pass\n")
    assert "test files" not in _pytest(tmp_path)
