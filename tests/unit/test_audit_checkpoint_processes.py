"""One checkpoint file, several processes appending (the server's reader processes,
``server.read_processes``, each run a checkpoint thread over the same chain): every line
stays whole and valid while they write and are read, and a line left unfinished by a
writer that died mid-write does not swallow the next process's checkpoint."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from radserve.audit import AuditEvent
from radserve.audit.seal import CheckpointFile, checkpoint_path, verify_sealed
from radserve.config import Settings, load_settings
from radserve.store import Store
from radserve.store.audited import open_audited

RECORDS = 60


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("RADSERVE_DATABASE_URL", "RADSERVE_CONFIG", "RADSERVE_AUDIT__KEY"):
        monkeypatch.delenv(name, raising=False)
    # every append checkpoints at once: the most concurrent writes the file can see
    return load_settings(None, data_dir=str(tmp_path / "data"), audit__checkpoint_interval_s=0)


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    settings.data_dir.mkdir(parents=True)
    opened, _ = open_audited(settings)
    yield opened
    opened.close()


def _reader(settings: Settings, name: str) -> None:
    """What a reader process does with the chain: its own store and checkpoint thread,
    an audit record per read, a last checkpoint at stop."""
    store, trail = open_audited(settings)
    trail.start()
    try:
        for i in range(RECORDS):
            store.append_audit(AuditEvent(action="phi.read", subject=f"{name}-{i}", payload={}))
    finally:
        trail.stop()
        store.close()


def _run_readers(settings: Settings, checkpoints: CheckpointFile, store: Store) -> list[str]:
    """Two reader processes appending; the problems any read of the file saw meanwhile."""
    context = multiprocessing.get_context("spawn")
    readers = [context.Process(target=_reader, args=(settings, n)) for n in ("a", "b")]
    for reader in readers:
        reader.start()
    seen: list[str] = []
    assert store.audit_key is not None
    while any(r.is_alive() for r in readers):
        scan = checkpoints.newest(store.audit_key)
        seen += scan.problems + scan.torn  # the shared lock: never half a line
    for reader in readers:
        reader.join(60)
        assert reader.exitcode == 0
    return seen


def test_two_reader_processes_share_the_checkpoint_file_safely(
    settings: Settings, store: Store
) -> None:
    checkpoints = CheckpointFile(checkpoint_path(settings))
    assert _run_readers(settings, checkpoints, store) == []
    assert store.audit_key is not None
    scan = checkpoints.newest(store.audit_key)
    assert scan.problems == scan.torn == []
    newest = scan.newest
    head_seq, head_hash = store.audit_head()
    assert newest is not None and (newest.seq, newest.head) == (head_seq, head_hash)
    assert head_seq >= 2 * RECORDS
    report, _ = verify_sealed(store, checkpoints)
    assert report.problems == []


def _one_record(settings: Settings) -> None:
    """A process that appends one record and checkpoints it at once (as the CLI does)."""
    store, _trail = open_audited(settings)
    try:
        store.append_audit(AuditEvent(action="test.event", subject="next", payload={}))
    finally:
        store.close()


def test_a_line_left_unfinished_does_not_swallow_the_next_checkpoint(
    settings: Settings, store: Store
) -> None:
    store.append_audit(AuditEvent(action="test.event", subject="s", payload={}))
    path = checkpoint_path(settings)
    with open(path, "ab") as handle:  # a writer that died mid-line (a short write)
        handle.write(b'{"head": "ab')
    writer = multiprocessing.get_context("spawn").Process(target=_one_record, args=(settings,))
    writer.start()
    writer.join(60)
    assert writer.exitcode == 0
    assert store.audit_key is not None
    scan = CheckpointFile(path).newest(store.audit_key)
    assert scan.newest is not None and scan.newest.seq == store.audit_head()[0] == 2
    assert scan.problems == []
    assert scan.torn == [  # kept, as evidence, and said for what it is
        "checkpoint line 2 is a torn append (ended by the next append): a writer stopped mid-line"
    ]
