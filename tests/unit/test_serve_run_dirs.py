"""``radserve serve`` with API readers: the private folders of killed servers are removed
at the next start, the folders of running ones are not."""

from __future__ import annotations

import os
from pathlib import Path

from radserve.commands.serve import remove_stale_run_dirs


def test_folders_of_dead_servers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / "radserve-api-999999999-abc"  # above any Linux pid_max
    live = tmp_path / f"radserve-api-{os.getppid()}-def"
    other = tmp_path / "radserve-api-notapid-ghi"
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "jobs.snapshot").write_bytes(b"x")
    remove_stale_run_dirs(tmp_path)
    assert not dead.exists()
    assert live.exists() and other.exists()
