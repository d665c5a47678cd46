"""``make demo`` / ``make test`` check the interpreter and the virtual environment before
anything else (tools/check_python.sh, the Makefile's ``check-python``).

Found on 2026-12-07: with a ``python3`` older than 3.11, ``make demo`` made ``.venv`` with
it and failed minutes later inside pip ("requires a different Python"); every later run
reused that ``.venv`` whatever ``PYTHON=`` said (the README told people to
``rm -rf .venv`` first). No Python older than 3.11 is installed here, so the "old
Python" is a script that answers as Python 3.9 does; each test runs real ``make`` in a
copy of the Makefile and the script, never on the repository's own ``.venv``, and stops
before pip."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile and the check, where a ``.venv`` may be made and removed."""
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "tools" / "check_python.sh", tmp_path / "tools" / "check_python.sh")
    return tmp_path


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _python_reporting(path: Path, version: str) -> Path:
    """An interpreter that answers every command as Python ``version`` would print its
    version (and would fail anything else, as pip did)."""
    return _script(path, f"echo {version}")


def _make(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(checkout), *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def _real_venv(venv: Path) -> None:
    """A venv that works, without the minutes of a real one: its python is this test's
    (3.11+, with pip), as a venv's is a link to its base interpreter."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)


def test_make_demo_with_python_3_9_stops_before_the_venv_naming_the_version(
    checkout: Path,
) -> None:
    old = _python_reporting(checkout / "old" / "python3", "3.9.18")
    done = _make(checkout, "demo", f"PYTHON={old}")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if not line.startswith("make:")]
    assert len(lines) == 1, done.stderr
    assert f"radserve needs Python 3.11 or later, but PYTHON={old} is Python 3.9.18" in lines[0]
    assert re.search(r"make demo PYTHON=python3\.1[1-9]\b", lines[0])  # a 3.11+ one to use
    assert "requires a different Python" not in done.stdout + done.stderr
    assert not (checkout / ".venv").exists()  # nothing made, no pip run
    assert "-m venv" not in done.stdout


def test_make_test_names_the_goal_and_a_missing_interpreter(checkout: Path) -> None:
    done = _make(checkout, "test", "PYTHON=python3.99")
    assert done.returncode != 0
    assert "PYTHON=python3.99 was not found" in done.stderr
    assert "make test PYTHON=" in done.stderr
    assert not (checkout / ".venv").exists()


def test_the_check_comes_before_anything_else_in_every_install(checkout: Path) -> None:
    for goal in ("demo", "test", "install", "install-test", "train"):
        planned = _make(checkout, "-n", goal).stdout.splitlines()
        assert planned[0].startswith("sh tools/check_python.sh"), (goal, planned[:3])


def test_a_broken_venv_radserve_made_is_removed_to_be_made_again(checkout: Path) -> None:
    venv = checkout / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(checkout / "gone" / "python3.10")  # removed since
    done = _make(checkout, "check-python", f"PYTHON={sys.executable}")
    assert done.returncode == 0, done.stderr
    assert ".venv is not usable (its bin/python does not run): removing it" in done.stderr
    assert not venv.exists()


def test_a_venv_of_an_old_python_is_made_again(checkout: Path) -> None:
    venv = checkout / "envs" / "radserve"
    _python_reporting(venv / "bin" / "python", "3.10.12")
    (venv / ".made-by-radserve").touch()
    done = _make(checkout, "check-python", f"PYTHON={sys.executable}", f"VENV={venv}")
    assert done.returncode == 0, done.stderr
    assert "not usable (it was made with Python 3.10.12): removing it" in done.stderr
    assert not venv.exists()


def test_a_broken_venv_radserve_did_not_make_is_left_alone_with_advice(checkout: Path) -> None:
    venv = checkout / "site-venv"
    _script(venv / "bin" / "python", "exit 127")
    done = _make(checkout, "install", f"PYTHON={sys.executable}", f"VENV={venv}")
    assert done.returncode != 0
    assert f"VENV={venv} is not usable (its bin/python does not run)" in done.stderr
    assert f"rm -rf {venv}" in done.stderr
    assert (venv / "bin" / "python").exists()


def test_a_working_venv_and_python_pass_silently(checkout: Path) -> None:
    _real_venv(checkout / ".venv")
    done = _make(checkout, "check-python", f"PYTHON={sys.executable}")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert (checkout / ".venv" / "bin" / "python").exists()
