"""radserve.durable: a file is replaced whole or not at all, and only dead writers'
temporaries are swept."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from tests.factories.syncs import logged_syncs
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


def test_a_temporary_of_an_earlier_process_with_this_pid_is_swept(tmp_path: Path) -> None:
    """A container restarted runs its server as the same pid on the same host name: the
    temporaries the server before it left (a staging copy of a model bundle, say) carry
    that pid too, and were kept for ever as a live writer's. Their names now say when
    the writer started."""
    mine = durable.temporary_path(tmp_path / "a.json")
    host, pid, start, nonce = mine.name.split(".")[-2].split("-")
    assert pid == str(os.getpid()) and start
    earlier = tmp_path / f".b.json.{host}-{pid}-{start}0-{nonce}.part"  # started at another tick
    older = tmp_path / f".c.json.{host}-{pid}-{nonce}.part"  # a name without a start
    for path in (mine, earlier, older):
        path.write_bytes(b"half")
    assert durable.sweep(tmp_path) == 1
    assert not earlier.exists() and mine.exists() and older.exists()


def test_a_batch_fsyncs_each_folder_once_after_its_last_rename_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seg_dir, other = tmp_path / "job-1", tmp_path / "job-2"
    seg_dir.mkdir()
    other.mkdir()
    log = logged_syncs(monkeypatch)
    with durable.batch():
        for name in ("organs-seg.dcm", "findings-seg.dcm", "measurements-sr.dcm"):
            durable.write_bytes(seg_dir / name, name.encode())
        durable.write_text(other / "report.json", "{}")
        log.append(("block", "ends"))
    folder_syncs = [e for e in log if e[0] == "fsync" and Path(e[1]).is_dir()]
    assert sorted(folder_syncs) == [("fsync", str(seg_dir)), ("fsync", str(other))]
    end = log.index(("block", "ends"))
    last_rename = max(i for i, e in enumerate(log) if e == ("replace", str(seg_dir / name)))
    assert all(log.index(sync) > end > last_rename for sync in folder_syncs)
    file_syncs = [e for e in log if e[0] == "fsync" and not Path(e[1]).is_dir()]
    assert len(file_syncs) == 4  # each file's data is still fsynced before its rename
    assert sorted(p.name for p in seg_dir.iterdir()) == [
        "findings-seg.dcm",
        "measurements-sr.dcm",
        "organs-seg.dcm",
    ]


def test_a_batch_that_fails_still_fsyncs_the_folder_of_what_it_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logged_syncs(monkeypatch)
    with pytest.raises(ValueError, match="second object"), durable.batch():
        durable.write_bytes(tmp_path / "organs-seg.dcm", b"seg")
        with durable.batch():  # an inner block leaves its folder to the outer one
            durable.write_bytes(tmp_path / "findings-seg.dcm", b"seg")
        assert ("fsync", str(tmp_path)) not in log
        raise ValueError("the second object could not be built")
    assert log.count(("fsync", str(tmp_path))) == 1
    assert (tmp_path / "organs-seg.dcm").read_bytes() == b"seg"


def test_outside_a_batch_and_on_another_thread_each_write_fsyncs_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logged_syncs(monkeypatch)
    durable.write_bytes(tmp_path / "a.json", b"{}")
    assert log[-1] == ("fsync", str(tmp_path))
    with durable.batch():
        worker = threading.Thread(target=durable.write_bytes, args=(tmp_path / "b.json", b"{}"))
        worker.start()
        worker.join()
        assert log[-1] == ("fsync", str(tmp_path))  # the thread's write did not wait


def test_an_older_versions_tmp_is_swept_once_no_writer_can_hold_it(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "job-1"
    folder.mkdir(parents=True)
    hour_ago = time.time() - 3600
    left = folder / ".report.json.k2j4h8.tmp"  # tempfile.mkstemp's name, writer gone
    held = folder / ".organs-seg.dcm.x81kq0.tmp"  # as old, but a process has it open
    fresh = folder / "report.json.tmp"  # written a moment ago: its writer may be busy
    result = folder / "report.json"
    for path in (left, held, fresh, result):
        path.write_bytes(b"{}")
    for path in (left, held, result):
        os.utime(path, (hour_ago, hour_ago))
    with open(held, "rb") as handle:
        holder = subprocess.Popen(["sleep", "60"], stdin=handle)
    try:
        assert durable.sweep_unowned(tmp_path / "results", "*/*.tmp") == 1
        assert not left.exists()
        assert held.exists() and fresh.exists() and result.exists()
    finally:
        holder.kill()
        holder.wait()
    assert durable.sweep_unowned(tmp_path / "results", "*/*.tmp") == 1  # its holder ended
    assert sorted(p.name for p in folder.iterdir()) == ["report.json", "report.json.tmp"]


def test_a_process_tag_is_not_alive_once_its_pid_belongs_to_a_later_process() -> None:
    """A record's owner tag names the process by host, pid and start: a container
    restarted runs its server as the same pid on the same host name, and the record of
    the server before it must not read as owned by a live process."""
    from tests.factories.writers import ended_and_running

    tag = durable.process_tag()
    assert durable.process_alive(tag)
    host, pid, start = tag.split("-")
    assert pid == str(os.getpid()) and start
    assert not durable.process_alive(f"{host}-{pid}-{start}0")  # that pid, started later
    assert durable.process_alive(f"{host}-{pid}")  # an older tag: any process of that pid
    assert durable.process_alive(f"0123abcd-{pid}-{start}")  # another host: cannot be asked
    with ended_and_running() as (ended, running):
        assert not durable.process_alive(f"{host}-{ended}")
        assert durable.process_alive(f"{host}-{running.pid}")
        assert not durable.process_alive(f"{host}-{running.pid}-{start}")
