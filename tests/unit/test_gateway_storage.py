"""Received instances: durable, stored once, never "stored" when the disk said no."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from radserve.gateway.errors import InstanceRejectedError, OutOfResourcesError
from radserve.gateway.storage import Disposition, InstanceStore, study_instances

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
    assert _save(store, b"first").disposition is Disposition.STORED
    again = _save(store, b"second")
    assert again.disposition is Disposition.DUPLICATE
    assert again.path.read_bytes() == b"first"


def test_concurrent_copies_of_one_instance_keep_exactly_one(tmp_path: Path) -> None:
    store = InstanceStore(tmp_path)
    results = []
    barrier = threading.Barrier(6)

    def send(k: int) -> None:
        barrier.wait()
        results.append(_save(store, f"copy {k}".encode()).disposition)

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
    with pytest.raises(InstanceRejectedError, match="not a valid UID"):
        _save(InstanceStore(tmp_path), **{field: value})


def test_partial_writes_left_by_a_crash_are_removed(tmp_path: Path) -> None:
    store = InstanceStore(tmp_path)
    stored = _save(store)
    partial = stored.path.parent / f".{SOP}.dcm.0123.part"
    partial.write_bytes(b"half")
    assert store.remove_partials() == 1
    assert not partial.exists() and stored.path.is_file()
