"""Studies stored for a submission that got no job (radserve.service.unclaimed): set
aside, then deleted by the sweep once no job names them and they were untouched for the
grace; an identical upload in the meantime touches the folder and keeps it, and an
upload after the sweep stores it again. Ages are set with ``os.utime`` (no sleeping)."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.test_store_jobs import new_job

from radserve.service.unclaimed import GRACE_S, UNCLAIMED_DIR, UnclaimedStudies, set_aside
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
