"""Group commit of audit records (radserve.store.audit_batch): a caller's future resolves
only once its record is committed; records that arrive during a commit share the next
one; one bad event does not refuse the others. Real SQLite store, real writer thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tests.factories.waits import until

from radserve.audit.chain import AuditEvent, AuditRecord
from radserve.store import Store, init_store
from radserve.store.audit_batch import AuditBatcher


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def _event(i: int) -> AuditEvent:
    return AuditEvent(action="phi.read", subject=f"job{i}", payload={"resource": "report"})


def _stored_subjects(store: Store) -> list[str | None]:
    return [r.subject for r in store.iter_audit() if r.action == "phi.read"]


def test_a_future_resolves_only_after_its_record_is_committed(store: Store) -> None:
    batcher = AuditBatcher(store)
    with store._audit_lock:  # a commit in progress elsewhere holds the chain
        future = batcher.submit(_event(0))
        until(batcher._queue.empty, "the writer to take the event", 30, step=0.005)
        assert not future.done()
        assert _stored_subjects(store) == []
    record = future.result(timeout=30)
    assert _stored_subjects(store) == ["job0"] and record.seq == store.audit_head()[0]
    batcher.close()


def test_events_that_arrive_during_a_commit_share_the_next_one(store: Store) -> None:
    batcher = AuditBatcher(store)
    with store._audit_lock:
        first = batcher.submit(_event(0))
        until(batcher._queue.empty, "the writer to take the first event", 30, step=0.005)
        rest = [batcher.submit(_event(i)) for i in range(1, 41)]
    records = [f.result(timeout=30) for f in [first, *rest]]
    assert batcher.batches == 2 and batcher.appended == 41  # 41 records, 2 commits
    assert [r.seq for r in records] == list(range(1, 42))  # in submission order
    assert _stored_subjects(store) == [f"job{i}" for i in range(41)]
    assert store.verify_audit().ok
    batcher.close()


def test_many_threads_appending_at_once_make_one_valid_chain(store: Store) -> None:
    futures = []
    lock = threading.Lock()

    def reader(base: int) -> None:
        for i in range(25):
            f = store.submit_audit(_event(base + i))
            with lock:
                futures.append(f)
            f.result(timeout=30)

    threads = [threading.Thread(target=reader, args=(k * 100,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({f.result().seq for f in futures}) == 200
    assert len(_stored_subjects(store)) == 200
    assert store.verify_audit().ok


def test_a_payload_that_cannot_be_stored_fails_its_own_caller_at_once(store: Store) -> None:
    with pytest.raises(TypeError):
        store.submit_audit(AuditEvent(action="phi.read", payload={"x": object()}))
    assert store.submit_audit(_event(1)).result(timeout=30).subject == "job1"


class _RefusesOneSubject(Store):
    """A store whose database refuses the batch holding a given subject (as a
    constraint or a full disk would), to show the others still get written."""

    refused = "job-bad"

    def append_audits(self, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        if any(e.subject == self.refused for e in events):
            raise RuntimeError("refused")
        return super().append_audits(events)

    def append_audit(self, event: AuditEvent) -> AuditRecord:
        if event.subject == self.refused:
            raise RuntimeError("refused")
        return super().append_audit(event)


def test_one_failing_event_does_not_refuse_the_rest_of_its_batch(store: Store) -> None:
    picky = _RefusesOneSubject(store.engine)
    batcher = AuditBatcher(picky)
    with store._audit_lock, picky._audit_lock:
        head = batcher.submit(_event(0))
        until(batcher._queue.empty, "the writer to take the first event", 30, step=0.005)
        good = batcher.submit(_event(1))
        bad = batcher.submit(AuditEvent(action="phi.read", subject="job-bad"))
        after = batcher.submit(_event(2))
    assert head.result(timeout=30).subject == "job0"
    with pytest.raises(RuntimeError, match="refused"):
        bad.result(timeout=30)
    assert good.result(timeout=30).subject == "job1"
    assert after.result(timeout=30).subject == "job2"
    assert _stored_subjects(store) == ["job0", "job1", "job2"]
    batcher.close()


def test_a_cancelled_request_is_not_audited(store: Store) -> None:
    batcher = AuditBatcher(store)
    with store._audit_lock:
        head = batcher.submit(_event(0))
        until(batcher._queue.empty, "the writer to take the first event", 30, step=0.005)
        gone = batcher.submit(_event(1))
        assert gone.cancel()  # the client went away before the writer took it
        kept = batcher.submit(_event(2))
    assert head.result(timeout=30) and kept.result(timeout=30)
    assert _stored_subjects(store) == ["job0", "job2"]
    batcher.close()


def test_close_writes_what_is_queued_and_a_later_append_starts_a_new_writer(
    store: Store,
) -> None:
    batcher = AuditBatcher(store)
    with store._audit_lock:
        queued = [batcher.submit(_event(i)) for i in range(5)]
        closer = threading.Thread(target=batcher.close)
        closer.start()
    closer.join(30)
    assert all(f.done() for f in queued) and len(_stored_subjects(store)) == 5
    assert batcher.append(_event(9)).subject == "job9"
    batcher.close()
    assert _stored_subjects(store)[-1] == "job9"
