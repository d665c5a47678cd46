"""A model install killed (SIGKILL) before any of its fsyncs and renames leaves the
bundle's final name absent or whole, never half-written (the real install in a child
process: tests/factories/install_child.py), and what it staged is removed by the next
start's sweep, which keeps a live install's. What a power cut would lose is covered by
the order of those calls (tests/unit/test_lifecycle_install.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.factories.bundles import write_test_bundles

from radserve.lifecycle.install import (
    read_install,
    remove_interrupted_installs,
    verify_install,
)

CHILD_TIMEOUT_S = 300  # a hang detector, not a performance bound


def _child(bundle: Path, data_dir: Path, kill_at: int | str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", "tests.factories.install_child"]
    return [*command, str(bundle), str(data_dir), str(kill_at)], env


def _install(bundle: Path, data_dir: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    command, env = _child(bundle, data_dir, kill_at)
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
        check=False,
    )


def test_an_install_killed_at_any_step_leaves_no_bundle_or_a_whole_one(tmp_path: Path) -> None:
    write_test_bundles(tmp_path / "src")
    bundle = tmp_path / "src" / "lesions-test" / "1.0.0"
    whole = _install(bundle, tmp_path / "whole", kill_at=0)
    assert whole.returncode == 0, whole.stderr[-4000:]
    steps = int(whole.stdout)
    present = []
    for kill_at in range(1, steps + 1):
        data_dir = tmp_path / f"killed-{kill_at}"
        child = _install(bundle, data_dir, kill_at)
        assert child.returncode == -signal.SIGKILL, child.stderr[-4000:]
        target = data_dir / "models" / "lesions-test" / "1.0.0"
        if target.exists():
            assert read_install(target) is not None and verify_install(target) == []
        present.append(target.exists())
        remove_interrupted_installs(data_dir)
        assert not any((data_dir / "models" / ".staging").iterdir())
    # absent up to the rename, whole from the moment it is made
    assert present[0] is False and present[-1] is True and present == sorted(present)


def test_the_sweep_keeps_a_live_installs_staging_and_removes_a_killed_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_test_bundles(tmp_path / "src")
    data_dir = tmp_path / "data"
    command, env = _child(tmp_path / "src" / "lesions-test" / "1.0.0", data_dir, "hold")
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    ) as child:
        try:
            assert child.stdout is not None
            staged = Path(child.stdout.readline().strip())  # the child holds it now
            staging = data_dir / "models" / ".staging"
            (folder,) = staging.iterdir()
            assert staged.is_relative_to(folder) and str(child.pid) in folder.name
            assert remove_interrupted_installs(data_dir) == 0  # the live install's is kept
            assert staged.is_dir()
            child.kill()
        finally:
            child.kill()
            child.wait(CHILD_TIMEOUT_S)
    with caplog.at_level(logging.INFO, logger="radserve.durable"):
        assert remove_interrupted_installs(data_dir) == 1
    assert not any(staging.iterdir())
    assert folder.name in caplog.text
