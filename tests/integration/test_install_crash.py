"""A model install killed (SIGKILL) before any of its fsyncs and renames leaves the
bundle's final name absent or whole, never half-written (the real install in a child
process: tests/factories/install_child.py). What a power cut would lose is covered by the
order of those calls (tests/unit/test_lifecycle_install.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.factories.bundles import write_test_bundles

from radserve.lifecycle.install import read_install, verify_install

CHILD_TIMEOUT_S = 300  # a hang detector, not a performance bound


def _install(bundle: Path, data_dir: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", "tests.factories.install_child"]
    return subprocess.run(
        [*command, str(bundle), str(data_dir), str(kill_at)],
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
    # absent up to the rename, whole from the moment it is made
    assert present[0] is False and present[-1] is True and present == sorted(present)
