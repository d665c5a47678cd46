"""radserve.durable: a file is replaced whole or not at all, and only dead writers'
temporaries are swept."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import IO

import pytest
from tests.factories.writers import ended_and_running

from radserve import durable


def test_a_file_is_replaced_whole_and_no_temporary_remains(tmp_path: Path) -> None:
    path = tmp_path / "results" / "job" / "report.json"
    durable.write_text(path, "old")
    assert durable.write_json(path, {"a": "é"}, ensure_ascii=False) == path
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": "é"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # results hold patient data
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "marker.json"
    durable.write_bytes(path, b"before", sync=False)

    def half(handle: IO[bytes]) -> None:
        handle.write(b"hal")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        durable.write_with(path, half)
    assert path.read_bytes() == b"before"
    assert [p.name for p in tmp_path.iterdir()] == ["marker.json"]


def test_the_temporary_name_says_what_it_is_and_who_writes_it(tmp_path: Path) -> None:
    target = tmp_path / "bundle-1.json"
    name = durable.temporary_path(target, pid=4242).name
    assert name.startswith(".bundle-1.json.") and name.endswith(durable.TEMPORARY_SUFFIX)
    assert "-4242-" in name


def test_a_dead_writers_temporary_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "job-1"
    folder.mkdir(parents=True)
    target = folder / "critical-1.json"
    with ended_and_running() as (ended, running):
        dead = durable.temporary_path(target, pid=ended)
        live = durable.temporary_path(target, pid=running.pid)
        ownerless = folder / ".critical-2.json.0123456789abcdef.part"  # an older writer's
        kept = folder / "critical-1.json"
        for path in (dead, live, ownerless, kept):
            path.write_bytes(b"half")
        assert durable.sweep(tmp_path / "results", f"*/.*{durable.TEMPORARY_SUFFIX}") == 2
        assert not dead.exists() and not ownerless.exists()
        assert live.exists() and kept.exists()
        running.kill()
        running.wait()
        assert durable.sweep(folder) == 1  # its writer ended
        assert [p.name for p in folder.iterdir()] == ["critical-1.json"]
