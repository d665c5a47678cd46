"""Studies stored for a submission that got no job (radserve.service.unclaimed): set
aside, then deleted by the sweep once no job names them and they were untouched for the
grace; an identical upload in the meantime touches the folder and keeps it, and an
upload after the sweep stores it again; every study is marked before it is published
and unmarked once its submission ends with a job (a crash in between leaves it marked:
tests/e2e/test_kill_before_job_row.py). Ages are set with ``os.utime`` (no sleeping)."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.test_store_jobs import new_job

from radserve.service.failover import SharedStorage
from radserve.service.storage import StorageProbe
from radserve.service.unclaimed import (
    GRACE_S,
    UNCLAIMED_DIR,
    UnclaimedStudies,
    set_aside,
    set_aside_if_refused,
)
from radserve.store import Store, init_store
from radserve.store.files import StoredStudy, store_study


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def _stored(data: Path, body: bytes) -> StoredStudy:
    return store_study(data, [("1.dcm", io.BytesIO(body))])


def _age(*paths: Path) -> None:
    """Make ``paths`` look untouched for longer than the grace."""
    old = time.time() - GRACE_S - 60
    for path in paths:
        os.utime(path, (old, old))


def _markers(data: Path) -> list[Path]:
    return sorted((data / UNCLAIMED_DIR).glob("*.json"))


def test_an_unclaimed_study_is_deleted_after_the_grace(tmp_path: Path, store: Store) -> None:
    data = tmp_path / "data"
    study = _stored(data, b"refused").path
    set_aside(data, study)
    sweep = UnclaimedStudies(data, store)
    assert sweep.sweep() == 0 and study.is_dir()  # within the grace: kept
    _age(study, *_markers(data))
    assert sweep.sweep() == 1
    assert not study.exists() and _markers(data) == []
    # the sender's retry stores it again
    again = _stored(data, b"refused")
    assert again.path == study and study.is_dir() and not again.existed


def test_a_study_a_job_names_is_kept(tmp_path: Path, store: Store) -> None:
    data = tmp_path / "data"
    study = _stored(data, b"named later").path
    set_aside(data, study)
    new_job(store, study_path=str(study))  # the C-STORE hand-over, tried again, got its job
    _age(study, *_markers(data))
    assert UnclaimedStudies(data, store).sweep() == 0
    assert study.is_dir() and _markers(data) == []


def test_an_identical_upload_meanwhile_keeps_it(tmp_path: Path, store: Store) -> None:
    data = tmp_path / "data"
    study = _stored(data, b"sent twice").path
    set_aside(data, study)
    _age(study, *_markers(data))
    assert _stored(data, b"sent twice").existed  # its job row not written yet: touched
    sweep = UnclaimedStudies(data, store)
    assert sweep.sweep() == 0 and study.is_dir()
    assert len(_markers(data)) == 1  # looked at again later


def test_the_marker_is_durable_before_the_study_is_published(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every fsync of the real store path, in order, by the inode it synced (a file is
    # synced under its temporary name; the real os.fsync still runs): the marker's data
    # and unclaimed/'s names before the rename into studies/ is made durable
    data = tmp_path / "data"
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    storage = SharedStorage(data, None, StorageProbe(data, interval_s=5, timeout_s=5), store)
    study = storage.store_study([("1.dcm", io.BytesIO(b"durably marked"))]).path
    [marker] = _markers(data)
    before = synced[: synced.index(study.parent.stat().st_ino)]  # studies/<xx>/ synced
    assert marker.stat().st_ino in before, synced  # its data (not fsynced before)
    assert (data / UNCLAIMED_DIR).stat().st_ino in before, synced  # its name
    assert data.stat().st_ino in before, synced  # unclaimed/'s own name, the first time


def test_a_study_is_marked_before_it_is_published_until_its_job_is_written(
    tmp_path: Path, store: Store
) -> None:
    data = tmp_path / "data"
    published: list[bool] = []  # whether the folder was in studies/ when it was marked
    store_study(
        data,
        [("1.dcm", io.BytesIO(b"first"))],
        before_publish=lambda folder: published.append(folder.exists()),
    )
    assert published == [False]
    storage = SharedStorage(data, None, StorageProbe(data, interval_s=5, timeout_s=5), store)
    study = storage.store_study([("1.dcm", io.BytesIO(b"accepted"))]).path
    assert [json.loads(m.read_text())["path"] for m in _markers(data)] == [str(study)]
    with set_aside_if_refused(data, study):  # its job row is written
        new_job(store, study_path=str(study))
    assert _markers(data) == []

    refused = storage.store_study([("1.dcm", io.BytesIO(b"refused"))]).path
    with pytest.raises(RuntimeError), set_aside_if_refused(data, refused):
        raise RuntimeError("the queue is full")
    assert len(_markers(data)) == 1  # set aside: the sweep deletes it after the grace
