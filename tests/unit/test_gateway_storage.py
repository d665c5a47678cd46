"""Received instances: durable, stored once, never "stored" when the disk said no."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest
from tests.factories.writers import ended_and_running

from radserve.gateway.errors import InstanceRejectedError, OutOfResourcesError
from radserve.gateway.storage import (
    Disposition,
    InstanceStore,
    partial_owner_alive,
    partial_path,
    study_instances,
)

STUDY, SOP, CT = "1.2.3", "1.2.3.4.5", "1.2.840.10008.5.1.4.1.1.2"


def _save(store: InstanceStore, data: bytes = b"DICM-data", **kwargs):
    values = {"study_instance_uid": STUDY, "sop_instance_uid": SOP, "sop_class_uid": CT}
    return store.save(data, **{**values, **kwargs})


def test_instance_is_filed_by_uid_and_fsynced(tmp_path: Path, monkeypatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    stored = _save(InstanceStore(tmp_path))
    assert stored.disposition is Disposition.STORED
    assert stored.path == tmp_path / "incoming" / STUDY / f"{SOP}.dcm"
    assert stored.path.read_bytes() == b"DICM-data"
    assert len(synced) >= 2  # the file, then its folder
    assert study_instances(stored.path.parent) == [stored.path]  # no temporary left


def test_same_sop_instance_uid_is_stored_once(tmp_path: Path) -> None:
    store = InstanceStore(tmp_path)
    first = _save(store, b"first")
    assert first.disposition is Disposition.STORED
    again = _save(store, b"first")
    assert again.disposition is Disposition.DUPLICATE
    assert again.path == first.path
    assert study_instances(first.path.parent) == [first.path]


def test_same_sop_instance_uid_with_other_content_is_kept_beside(tmp_path: Path) -> None:
    """Other bytes under one SOP Instance UID (in this association or a later one) are
    kept beside the first copy, once, so ingest sees both and names the conflict."""
    store = InstanceStore(tmp_path)
    first = _save(store, b"first")
    other = _save(store, b"second")
    assert other.disposition is Disposition.STORED
    assert other.path != first.path and other.path.read_bytes() == b"second"
    assert first.path.read_bytes() == b"first"
    assert _save(store, b"second").disposition is Disposition.DUPLICATE
    assert study_instances(first.path.parent) == sorted([first.path, other.path])


def test_concurrent_copies_of_one_instance_keep_exactly_one(tmp_path: Path) -> None:
    store = InstanceStore(tmp_path)
    results = []
    barrier = threading.Barrier(6)

    def send(k: int) -> None:
        barrier.wait()
        results.append(_save(store, b"one copy").disposition)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results).count(Disposition.STORED) == 1
    assert len(study_instances(tmp_path / "incoming" / STUDY)) == 1
    assert [p.name for p in (tmp_path / "incoming" / STUDY).iterdir()] == [f"{SOP}.dcm"]


def test_other_storage_classes_go_to_quarantine(tmp_path: Path) -> None:
    stored = _save(
        InstanceStore(tmp_path), quarantine=True, sop_class_uid="1.2.840.10008.5.1.4.1.1.88.34"
    )
    assert stored.disposition is Disposition.QUARANTINED
    assert stored.path.parent == tmp_path / "quarantine" / STUDY


def test_write_error_is_out_of_resources_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    store = InstanceStore(tmp_path)
    with pytest.raises(OutOfResourcesError, match="ENOSPC"):
        _save(store)
    monkeypatch.undo()
    assert list((tmp_path / "incoming").rglob("*")) in ([], [tmp_path / "incoming" / STUDY])
    assert _save(store).disposition is Disposition.STORED  # retried by the sender: stored


def test_free_space_reserve_refuses_before_writing(tmp_path: Path) -> None:
    store = InstanceStore(tmp_path, min_free_bytes=1 << 62)
    with pytest.raises(OutOfResourcesError, match="ENOSPC"):
        _save(store)
    assert study_instances(tmp_path / "incoming" / STUDY) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("study_instance_uid", ""),
        ("study_instance_uid", "../../etc"),
        ("sop_instance_uid", "Doe^John"),
        ("sop_instance_uid", "1." + "2" * 70),
    ],
)
def test_unusable_uids_are_refused(tmp_path: Path, field: str, value: str) -> None:
    with pytest.raises(InstanceRejectedError, match=r"missing|not a valid UID|at most 64"):
        _save(InstanceStore(tmp_path), **{field: value})


def test_partial_writes_left_by_a_crash_are_removed(tmp_path: Path) -> None:
    store = InstanceStore(tmp_path)
    stored = _save(store)
    partial = stored.path.parent / f".{SOP}.dcm.0123.part"  # no owner in its name
    partial.write_bytes(b"half")
    assert store.remove_partials() == 1
    assert not partial.exists() and stored.path.is_file()


def test_only_the_partial_writes_of_stopped_processes_are_removed(tmp_path: Path) -> None:
    """A live writer's temporary file (another receiving process's association) stays;
    a dead one's goes; another host's cannot be judged here and stays."""
    store = InstanceStore(tmp_path)
    folder = _save(store).path.parent
    target = folder / f"{SOP}.dcm"
    with ended_and_running() as (ended, running):
        dead = partial_path(folder, target, pid=ended)
        live = partial_path(folder, target, pid=running.pid)
        mine = partial_path(folder, target)
        host = dead.name.split(".")[-2].split("-")[0]  # .<final>.<host>-<pid>-<nonce>.part
        elsewhere = "0" * 8 if host != "0" * 8 else "1" * 8
        other_host = folder / dead.name.replace(f".{host}-", f".{elsewhere}-")
        for partial in (dead, live, mine, other_host):
            partial.write_bytes(b"half")
        assert not partial_owner_alive(dead) and partial_owner_alive(live)
        assert store.remove_partials() == 1
        assert not dead.exists()
        assert live.exists() and mine.exists() and other_host.exists()
        running.kill()
        running.wait()
        assert store.remove_partials() == 1  # its writer ended
        assert not live.exists() and mine.exists()


# -- a file handed over (the C-STORE spool file) -----------------------------------------


def _spool_file(folder: Path, data: bytes) -> Path:
    """A file as pynetdicom leaves a received data set: private (0600), in a folder of the
    same file system."""
    folder.mkdir(parents=True, exist_ok=True)
    spooled = folder / "tmp1234.dcm"
    spooled.write_bytes(data)
    spooled.chmod(0o600)
    return spooled


@pytest.mark.parametrize("durability", ["per_instance", "group"])
def test_a_file_on_the_same_file_system_is_linked_not_copied(
    tmp_path: Path, monkeypatch, durability: str
) -> None:
    """Its bytes are written once (no second copy), made durable before the final name
    exists, readable as any stored instance, and stay when the spool name goes."""
    data = os.urandom(300_000)
    spooled = _spool_file(tmp_path / "receiving", data)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real_fsync(fd))
    )
    store = InstanceStore(tmp_path, durability=durability)
    try:
        stored = _save(store, spooled)
    finally:
        store.close()
    assert stored.disposition is Disposition.STORED
    assert stored.path.stat().st_ino == spooled.stat().st_ino  # one inode: no copy
    assert spooled.stat().st_ino in synced  # its data made durable
    assert stat.S_IMODE(stored.path.stat().st_mode) == 0o644
    spooled.unlink()  # what pynetdicom does after the handler
    assert stored.path.read_bytes() == data
    assert study_instances(stored.path.parent) == [stored.path]  # no temporary left


def test_a_file_that_cannot_be_linked_is_copied(tmp_path: Path, monkeypatch) -> None:
    """Another file system (EXDEV): the bytes are copied, the handed file left alone."""
    data = os.urandom(100_000)
    spooled = _spool_file(tmp_path / "elsewhere", data)

    def cross_device(_source: object, _target: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    real_link = os.link
    monkeypatch.setattr(
        os,
        "link",
        lambda source, target: (
            cross_device(source, target) if Path(source) == spooled else real_link(source, target)
        ),
    )
    stored = _save(InstanceStore(tmp_path), spooled)
    assert stored.path.read_bytes() == data
    assert stored.path.stat().st_ino != spooled.stat().st_ino
    assert spooled.read_bytes() == data and stat.S_IMODE(spooled.stat().st_mode) == 0o600
    assert study_instances(stored.path.parent) == [stored.path]


def test_a_failed_link_leaves_nothing_and_is_out_of_resources(tmp_path: Path, monkeypatch) -> None:
    spooled = _spool_file(tmp_path / "receiving", b"DICM-data")

    def full(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutOfResourcesError, match="EIO"):
        _save(InstanceStore(tmp_path), spooled)
    assert list((tmp_path / "incoming" / STUDY).iterdir()) == []
    assert spooled.read_bytes() == b"DICM-data"


# -- group commit (gateway.durability: group) ------------------------------------------


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.parametrize("group_sync", ["fsync", "syncfs"])
def test_group_commit_returns_only_after_its_batch_is_durable(
    tmp_path: Path, monkeypatch, group_sync: str
) -> None:
    """Every save returns after: its data synced (its own fsync, or the batch's syncfs),
    its final name linked, its folder fsynced, the batch reported durable. The committer is
    held inside the durable hook while the savers wait: none of them may have returned."""
    log: list[tuple[str, object]] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (real_fsync(fd), log.append(("fsync", _fd_path(fd))))
    )
    held, release = threading.Event(), threading.Event()

    def on_durable(paths: list[Path]) -> None:
        log.append(("durable", tuple(paths)))
        held.set()
        assert release.wait(30)

    store = InstanceStore(
        tmp_path, durability="group", group_sync=group_sync, on_durable=on_durable
    )
    sops = [f"1.2.3.4.{k}" for k in range(8)]

    def send(sop: str) -> None:
        stored = _save(store, f"data {sop}".encode(), sop_instance_uid=sop)
        assert stored.disposition is Disposition.STORED
        log.append(("returned", stored.path))

    threads = [threading.Thread(target=send, args=(sop,)) for sop in sops]
    for thread in threads:
        thread.start()
    assert held.wait(30)
    assert not [entry for entry in log if entry[0] == "returned"]  # the batch is held
    release.set()
    for thread in threads:
        thread.join(30)
    store.close()
    folder = tmp_path / "incoming" / STUDY
    assert [p.name for p in study_instances(folder)] == sorted(f"{s}.dcm" for s in sops)
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left
    for sop in sops:
        path = folder / f"{sop}.dcm"
        assert path.read_bytes() == f"data {sop}".encode()
        durable = next(i for i, e in enumerate(log) if e[0] == "durable" and path in e[1])
        returned = log.index(("returned", path))
        folder_synced = max(i for i, e in enumerate(log[:durable]) if e == ("fsync", str(folder)))
        assert folder_synced < durable < returned
        if group_sync == "fsync":  # its temporary file's own fsync came first
            data_synced = next(
                i for i, e in enumerate(log) if e[0] == "fsync" and f"/.{sop}.dcm." in str(e[1])
            )
            assert data_synced < folder_synced
    assert store.committer is None  # closed


def test_group_commit_keeps_one_of_concurrent_copies(tmp_path: Path) -> None:
    store = InstanceStore(tmp_path, durability="group")
    results = []
    barrier = threading.Barrier(6)

    def send(k: int) -> None:
        barrier.wait()
        results.append(_save(store, b"one copy").disposition)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    store.close()
    assert sorted(results).count(Disposition.STORED) == 1 and len(results) == 6
    assert [p.name for p in (tmp_path / "incoming" / STUDY).iterdir()] == [f"{SOP}.dcm"]


def test_group_commit_sync_error_is_out_of_resources_and_names_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    def broken(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    store = InstanceStore(tmp_path, durability="group")
    with pytest.raises(OutOfResourcesError, match="EIO"):
        _save(store)
    monkeypatch.undo()
    assert study_instances(tmp_path / "incoming" / STUDY) == []
    assert not list((tmp_path / "incoming" / STUDY).iterdir())  # temporary removed too
    assert _save(store).disposition is Disposition.STORED  # the sender's retry: stored
    store.close()
    again = _save(store, sop_instance_uid="1.2.3.4.6")  # a save after close starts another
    assert again.disposition is Disposition.STORED and again.path.is_file()
    store.close()


def test_unknown_durability_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        InstanceStore(tmp_path, durability="eventually")  # type: ignore[arg-type]
