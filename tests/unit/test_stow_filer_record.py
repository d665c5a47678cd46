"""The record of who filed a STOW-RS study for the quiet period (``.radserve-filer.json``
in the study's folder): written and read back unchanged, the latest filer kept, and a
damaged or planted record ignored with a warning -- the study is still handed over after
a restart, its job then by no key, as before the record existed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from radserve.gateway.completeness import StudyTracker
from radserve.service.dicomweb import (
    FILER_FILE,
    Filer,
    origin_of,
    read_filer,
    write_filer,
)
from radserve.service.intake import Origin

STUDY = "1.2.3.4"
# stands for anything a damaged file may hold: never repeated in a log line
CONTENT = "DOE^JANE"
GROUPS = {"key-n1": "site:N", "key-n2": "site:N", "key-s": "site:S", "admin": "actor:admin"}


def group_of(actor: str | None) -> str:
    return "" if actor is None else GROUPS.get(actor, f"actor:{actor}")


def no_rule(actor: str | None) -> str:
    return ""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    study = tmp_path / "incoming" / STUDY
    study.mkdir(parents=True)
    return study


@pytest.mark.parametrize(
    "filer",
    [
        Filer("key-n1", "192.0.2.7", restricted=True),
        Filer("admin", None, restricted=False),
        Filer("user:alice", "2001:db8::1", restricted=True),
    ],
)
def test_a_filer_is_read_back_as_written(folder: Path, filer: Filer) -> None:
    write_filer(folder, filer)
    assert read_filer(folder) == filer
    assert (folder / FILER_FILE).stat().st_mode & 0o077 == 0  # the service user's only


def test_the_latest_filer_is_kept_and_an_unchanged_one_is_not_rewritten(folder: Path) -> None:
    # each write says whether the study had another filer before (the STOW-RS bridge
    # hands a study over again for a new sender)
    assert write_filer(folder, Filer("key-n1", "192.0.2.7", restricted=True)) is True
    assert write_filer(folder, Filer("key-s", "198.51.100.2", restricted=True)) is True
    assert read_filer(folder) == Filer("key-s", "198.51.100.2", restricted=True)
    inode = (folder / FILER_FILE).stat().st_ino
    assert write_filer(folder, Filer("key-s", "198.51.100.2", restricted=True)) is False
    assert (folder / FILER_FILE).stat().st_ino == inode  # no second write, no fsync
    # the latest filed by no key: not the earlier key's job
    assert write_filer(folder, None) is True
    assert not (folder / FILER_FILE).exists()
    assert write_filer(folder, None) is False
    assert read_filer(folder) is None


def test_a_study_with_no_record_has_no_filer_and_no_warning(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert read_filer(folder) is None
    assert caplog.records == []


def _valid(**changes: object) -> bytes:
    data: dict[str, object] = {
        "version": 1,
        "key_id": "key-n1",
        "client": "192.0.2.7",
        "restricted": True,
    }
    data.update(changes)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "not UTF-8 JSON"),
        (b'{"key_id": "' + CONTENT.encode(), "not UTF-8 JSON"),
        (b"\xff\xfe" + CONTENT.encode(), "not UTF-8 JSON"),
        (b"[" * 4000 + b"]" * 4000, "larger than 4096 bytes"),
        (b"[" * 2000 + b"]" * 2000, "not UTF-8 JSON|not a JSON object"),
        (_valid() + b" " * 5000, "larger than 4096 bytes"),
        (json.dumps([CONTENT]).encode(), "not a JSON object"),
        (_valid(version=2), "version is not 1"),
        (_valid(key_id=None), "key_id is not"),
        (_valid(key_id=""), "key_id is not"),
        (_valid(key_id=7), "key_id is not"),
        (_valid(key_id="k" * 33), "key_id is not"),
        (_valid(key_id=f"key\n{CONTENT}"), "key_id is not"),
        (_valid(key_id="ключ"), "key_id is not"),
        (_valid(client="c" * 129), "client is neither"),
        (_valid(client=["192.0.2.7"]), "client is neither"),
        (_valid(restricted="no"), "restricted is not"),
        (_valid(restricted=None), "restricted is not"),
    ],
)
def test_a_damaged_record_is_ignored_with_a_warning_that_quotes_nothing_of_it(
    folder: Path, caplog: pytest.LogCaptureFixture, content: bytes, reason: str
) -> None:
    (folder / FILER_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, "radserve.service.dicomweb"):
        assert read_filer(folder) is None
    [record] = caplog.records
    message = record.getMessage()
    assert STUDY in message and "no key" in message
    assert any(part in message for part in reason.split("|")), message
    assert CONTENT not in message


def test_a_record_that_is_no_regular_file_is_never_opened(
    folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO would block the hand-over forever, a link may point anywhere (a valid
    record elsewhere, or /dev/zero): neither is followed."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(_valid())
    cases = {
        "fifo": lambda path: os.mkfifo(path),
        "link": lambda path: path.symlink_to(elsewhere),
        "device": lambda path: path.symlink_to("/dev/zero"),
        "folder": lambda path: path.mkdir(),
    }
    for make in cases.values():
        path = folder / FILER_FILE
        make(path)
        with caplog.at_level(logging.WARNING, "radserve.service.dicomweb"):
            assert read_filer(folder) is None
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    assert len(caplog.records) == len(cases)
    assert all("not a regular file" in r.getMessage() for r in caplog.records)


def test_a_damaged_record_does_not_stop_recovery_and_its_job_has_no_key(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a restart the tracker reopens the study, and its hand-over reads the record:
    a damaged one costs the key (the job is no site's, admins see it), not the study."""
    (folder / "1.2.3.4.1.dcm").write_bytes(b"instance")
    (folder / FILER_FILE).write_bytes(b"\x00" * 100_000)
    origins: list[Origin] = []
    clock = iter(range(1000, 2000))
    tracker = StudyTracker(
        lambda study: origins.append(origin_of(read_filer(study.folder), group_of)),
        quiet_s=1.0,
        clock=lambda: float(next(clock)),
    )
    with caplog.at_level(logging.WARNING, "radserve.service.dicomweb"):
        assert tracker.recover(folder.parent) == 1
        [handed] = tracker.poll()
    assert handed.study_instance_uid == STUDY
    [origin] = origins
    assert origin.key_id is None and origin.sees is None and origin.source == "dicomweb"
    assert "larger than 4096 bytes" in caplog.text


def test_a_recovered_filer_is_answered_only_by_the_jobs_its_rule_lets_it_see() -> None:
    """The record keeps the key's id and whether a rule limited it; the rule itself is
    asked again (``ReadAccess.group_of``): a site's job is not answered from another
    site's result after a restart either."""
    site_n = origin_of(Filer("key-n1", "192.0.2.7", restricted=True), group_of)
    assert (site_n.key_id, site_n.client, site_n.source) == ("key-n1", "192.0.2.7", "dicomweb")
    assert site_n.sees is not None
    assert [site_n.sees(a) for a in ("key-n1", "key-n2", "key-s", "admin", None)] == [
        True,
        True,
        False,
        False,
        False,
    ]
    # an admin (or any key under visibility: all) was not limited: every result answers
    assert origin_of(Filer("admin", None, restricted=False), group_of).sees is None
    # the rule lifted since (visibility: all): nothing limits it any more
    assert origin_of(Filer("key-n1", None, restricted=True), no_rule).sees is None
    # filed by no key: the job is no one's, as a DICOM gateway job is
    nobody = origin_of(None, group_of)
    assert (nobody.key_id, nobody.sees) == (None, None)


def test_the_filer_of_a_request_is_its_key_and_whether_a_rule_limited_it() -> None:
    def limited(actor: str | None) -> bool:
        return False

    assert Filer.of(Origin("key-n1", "192.0.2.7", sees=limited)) == Filer(
        "key-n1", "192.0.2.7", restricted=True
    )
    assert Filer.of(Origin("admin", "192.0.2.7")) == Filer("admin", "192.0.2.7", restricted=False)
    assert Filer.of(Origin(client="dicomweb")) is None
