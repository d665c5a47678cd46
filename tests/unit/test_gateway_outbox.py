"""The durable outbox on SQLite (and PostgreSQL when configured), a scripted sender and ``now``:
back-off, permanent failures, leases after a crash, restarts — no network, no sleeps."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, generate_uid
from sqlalchemy import text
from tests.factories.postgres import postgres_schema

from radserve.domain.priority import PriorityClass
from radserve.gateway.config import Destination
from radserve.gateway.errors import GatewayConfigError, GatewayError
from radserve.gateway.outbox import Lane, Outbox, RetryPolicy
from radserve.gateway.scu import Outcome, OutgoingFile, ResultCallback, SendResult, StillOurs
from radserve.store import Store, init_store
from radserve.store.errors import StoreError
from radserve.store.outbox import OutboxState, OutboxStore, Scope, Settlement

T0 = dt.datetime(2025, 1, 1, 8, 0, tzinfo=dt.UTC)
PACS = Destination(name="pacs", ae_title="PACS", host="127.0.0.1", port=104)
ARCHIVE = Destination(name="archive", ae_title="ARCHIVE", host="127.0.0.1", port=105)
SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SR = "1.2.840.10008.5.1.4.1.1.88.34"
URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT


class ScriptedSender:
    """Answers each file with the next outcome of ``script`` (SENT when it runs out)."""

    def __init__(self, *script: Outcome) -> None:
        self.script = list(script)
        self.sent: list[tuple[str, str]] = []

    def send(
        self,
        destination: Destination,
        files: Sequence[OutgoingFile],
        on_result: ResultCallback,
        *,
        still_ours: StillOurs | None = None,
    ) -> None:
        for item in files:
            if still_ours is not None and not still_ours(item):
                continue
            outcome = self.script.pop(0) if self.script else Outcome.SENT
            if outcome is Outcome.SENT:
                self.sent.append((destination.name, item.sop_instance_uid))
            on_result(item, SendResult(outcome, f"scripted {outcome.value}"))


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A schema of its own on the test PostgreSQL (``RADSERVE_TEST_DATABASE_URL``)."""
    with postgres_schema("radserve_outbox") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path: Path) -> Iterator[tuple[Store, OutboxStore]]:
    if request.param == "sqlite":
        store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    else:
        store = init_store(request.getfixturevalue("postgres_url"))
        with store.engine.begin() as connection:
            connection.execute(text("TRUNCATE outbox_deliveries CASCADE"))
    yield store, OutboxStore(store.engine)
    store.close()


def _result(folder: Path, sop_class: str = SEG, syntax: str = ExplicitVRLittleEndian) -> Path:
    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, generate_uid()
    ds.StudyInstanceUID = "1.2.3"
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = syntax
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    path = folder / f"{ds.SOPInstanceUID}.dcm"
    folder.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def _outbox(outbox_store: OutboxStore, sender, **kwargs) -> Outbox:
    return Outbox(outbox_store, [PACS, ARCHIVE], sender, **kwargs)


def test_enqueue_is_one_row_per_instance_and_destination_and_idempotent(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender())
    files = [_result(tmp_path), _result(tmp_path, SR, JPEG2000Lossless)]
    items = outbox.enqueue(files, job_id="job-1", now=T0)
    assert len(items) == 4 and {i.state for i in items} == {OutboxState.PENDING}
    assert {i.destination for i in items} == {"pacs", "archive"}
    assert items[2].transfer_syntax_uid == JPEG2000Lossless and items[2].sop_class_uid == SR
    assert [i.id for i in outbox.enqueue(files, now=T0)] == [i.id for i in items]
    assert rows.counts()[OutboxState.PENDING] == 4


def test_enqueue_refuses_unknown_destinations_and_non_dicom(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender())
    with pytest.raises(GatewayConfigError, match=r"unknown destination\(s\) \['nowhere'\]"):
        outbox.enqueue([_result(tmp_path)], destinations=["nowhere"])
    (tmp_path / "x.txt").write_text("no")
    with pytest.raises(GatewayError, match="not a readable DICOM file"):
        outbox.enqueue([tmp_path / "x.txt"])


def test_delivered_rows_are_marked_sent_and_never_sent_again(db, tmp_path) -> None:
    _, rows = db
    sender = ScriptedSender()
    outbox = _outbox(rows, sender)
    outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=T0)
    report = outbox.deliver_pending(T0)
    assert (report.claimed, report.sent) == (1, 1)
    [item] = rows.items()
    assert item.state is OutboxState.SENT and item.attempts == 1 and item.sent_at == T0
    assert outbox.deliver_pending(T0 + dt.timedelta(days=1)).claimed == 0
    assert len(sender.sent) == 1


def test_retryable_failures_back_off_exponentially(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender(*[Outcome.RETRY] * 3))
    outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=T0)
    now, waits = T0, []
    for _ in range(3):
        assert outbox.deliver_pending(now).retried == 1
        [item] = rows.items()
        assert item.state is OutboxState.PENDING and item.last_error == "scripted retry"
        waits.append((item.next_attempt_at - now).total_seconds())
        assert outbox.deliver_pending(item.next_attempt_at - dt.timedelta(seconds=1)).claimed == 0
        now = item.next_attempt_at
    # each back-off runs from the attempt's end (radserve.gateway.outbox.AttemptClock:
    # the claim time plus the whole seconds the attempt took, 0 unless the host is slow)
    took = [wait - backoff for wait, backoff in zip(waits, [30, 60, 120], strict=True)]
    assert all(t.is_integer() and 0 <= t <= 5 for t in took), waits
    assert outbox.deliver_pending(now).sent == 1
    assert rows.items()[0].attempts == 4


def test_retry_policy_caps_and_gives_up() -> None:
    policy = RetryPolicy(first_delay_s=30, max_delay_s=3600)
    assert [policy.delay(n).total_seconds() for n in (1, 2, 3, 8, 20)] == [
        30,
        60,
        120,
        3600,
        3600,
    ]


def test_retries_end_in_failed_permanent_after_the_give_up_age(db, tmp_path) -> None:
    _, rows = db
    policy = RetryPolicy(give_up_after_s=6 * 3600)
    outbox = _outbox(rows, ScriptedSender(*[Outcome.RETRY] * 100), policy=policy)
    outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=T0)
    now = T0
    while rows.items()[0].state is OutboxState.PENDING:
        now = max(now, rows.items()[0].next_attempt_at)
        outbox.deliver_pending(now)
    [item] = rows.items()
    assert item.state is OutboxState.FAILED_PERMANENT
    assert item.last_error.startswith(f"gave up after {item.attempts} attempts")
    assert now - T0 >= dt.timedelta(hours=6)


def test_permanent_failure_needs_a_person_then_rearm_delivers(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender(Outcome.PERMANENT))
    outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=T0)
    assert outbox.deliver_pending(T0).failed == 1
    [item] = rows.items()
    assert item.state is OutboxState.FAILED_PERMANENT and item.last_error == "scripted permanent"
    assert outbox.deliver_pending(T0 + dt.timedelta(days=30)).claimed == 0
    assert rows.rearm(now=T0, destination="pacs") == 1
    assert outbox.deliver_pending(T0).sent == 1


def test_missing_file_and_unconfigured_destination_fail_permanently(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender())
    gone = _result(tmp_path)
    outbox.enqueue([gone, _result(tmp_path)], destinations=["pacs", "archive"], now=T0)
    gone.unlink()
    reconfigured = Outbox(rows, [PACS], ScriptedSender())  # "archive" was removed
    report = reconfigured.deliver_pending(T0)
    assert (report.claimed, report.sent, report.failed) == (4, 1, 3)
    errors = sorted(i.last_error or "" for i in rows.items(state="failed_permanent"))
    assert sum("no longer configured" in e for e in errors) == 2
    assert sum("is gone" in e for e in errors) == 1


def test_each_lane_claims_only_its_destination_and_leftovers_only_unconfigured_ones(
    db, tmp_path
) -> None:
    """One sender per destination (a dead peer stalls only its own lane); the rows of a
    destination no longer configured have a lane of their own that fails them."""
    _, rows = db
    outbox = _outbox(rows, ScriptedSender())
    outbox.enqueue([_result(tmp_path), _result(tmp_path)], destinations=["pacs", "archive"], now=T0)
    reconfigured = Outbox(rows, [PACS], ScriptedSender())  # "archive" was removed
    leftovers = Lane(reconfigured, Scope(other_than=("pacs",)))
    assert leftovers.next_due() == T0
    report = leftovers.deliver_pending(T0)
    assert (report.claimed, report.failed) == (2, 2)
    assert {i.destination for i in rows.items(state="failed_permanent")} == {"archive"}
    assert leftovers.next_due() is None
    pacs = Lane(reconfigured, "pacs")
    assert pacs.deliver_pending(T0).sent == 2
    assert {i.destination for i in rows.items(state="sent")} == {"pacs"}


def test_a_crash_while_sending_resends_once_after_the_lease(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender())
    outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=T0)
    [claimed] = rows.claim_due(T0)  # a worker claims the row, then the process dies
    assert claimed.state is OutboxState.SENDING
    assert outbox.deliver_pending(T0 + dt.timedelta(minutes=14)).claimed == 0
    report = outbox.deliver_pending(T0 + dt.timedelta(minutes=15))
    assert report.sent == 1 and rows.items()[0].attempts == 2


def test_a_late_answer_after_the_row_was_taken_over_settles_nothing(db, tmp_path) -> None:
    """A sender waits on a slow PACS past its lease; another claims the row again and
    sends it. The first one's late answer (a failure, or a success) must not move the row
    the second is sending: it used to, so a real acknowledgement could be overwritten by
    a stale failure (and the notice or instance sent yet again)."""
    _, rows = db
    outbox = _outbox(rows, ScriptedSender())
    outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=T0)
    [first] = rows.claim_due(T0)
    later = T0 + dt.timedelta(minutes=15)
    [second] = rows.claim_due(later)  # the first one's lease ran out
    assert (first.attempts, second.attempts) == (1, 2)
    stale = Settlement.failed(first.id, now=later, error="late: timed out", attempt=1)
    assert rows.settle_all([stale]) == [False]
    [row] = rows.items()
    assert row.state is OutboxState.SENDING and row.last_error is None
    fresh = Settlement.sent(second.id, now=later, attempt=2)
    assert rows.settle_all([fresh]) == [True]
    assert rows.items()[0].state is OutboxState.SENT


def test_a_single_server_reclaims_its_own_sending_rows_at_restart(db, tmp_path) -> None:
    """Issue 12, item 11: no 15-minute wait when no other server could be sending."""
    store, rows = db
    outbox = _outbox(rows, ScriptedSender())
    outbox.enqueue(
        [_result(tmp_path / "a"), _result(tmp_path / "b")], destinations=["pacs"], now=T0
    )
    claimed = rows.claim_due(T0)  # then the process dies mid-send
    assert {c.lease_owner for c in claimed} == {rows.owner}
    restarted = OutboxStore(store.engine)  # the next incarnation, same host
    assert restarted.owner != rows.owner
    assert restarted.reclaim(now=T0 + dt.timedelta(seconds=5), shared=False) == 2
    again = restarted.items()
    assert {r.state for r in again} == {OutboxState.PENDING}
    assert all(r.attempts == 1 and "restart" in str(r.last_error) for r in again)
    sender = ScriptedSender()
    report = _outbox(restarted, sender).deliver_pending(T0 + dt.timedelta(seconds=5))
    assert report.sent == 2 and len(sender.sent) == 2
    assert {r.state for r in restarted.items()} == {OutboxState.SENT}
    assert {r.lease_owner for r in restarted.items()} == {None}


def test_replicas_reclaim_only_their_own_instance_rows(db, tmp_path) -> None:
    store, _ = db
    node_a = OutboxStore(store.engine, instance="node_a")
    node_b = OutboxStore(store.engine, instance="nodeXa")  # '_' must not match as LIKE
    outbox = _outbox(node_a, ScriptedSender())
    outbox.enqueue(
        [_result(tmp_path / "a"), _result(tmp_path / "b")], destinations=["pacs"], now=T0
    )
    [first] = node_a.claim_due(T0, limit=1)
    [second] = node_b.claim_due(T0, limit=1)
    restarted_a = OutboxStore(store.engine, instance="node_a")
    assert restarted_a.reclaim(now=T0, shared=True) == 1
    states = {r.id: (r.state, r.lease_owner) for r in restarted_a.items()}
    assert states[first.id] == (OutboxState.PENDING, None)
    assert states[second.id] == (OutboxState.SENDING, node_b.owner)  # may still be sending
    assert [r.id for r in restarted_a.claim_due(T0)] == [first.id]
    assert restarted_a.settle_all([Settlement.sent(first.id, now=T0)])[0]
    later = restarted_a.claim_due(T0 + dt.timedelta(minutes=15))  # its lease ran out
    assert [r.id for r in later] == [second.id] and later[0].lease_owner == restarted_a.owner


def test_status_per_destination_and_operator_retry(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender(Outcome.RETRY, Outcome.PERMANENT))
    outbox.enqueue(
        [_result(tmp_path / "a"), _result(tmp_path / "b")], destinations=["pacs"], now=T0
    )
    outbox.enqueue([_result(tmp_path / "c")], destinations=["archive"], now=T0)
    outbox.deliver_pending(T0)  # pacs: one retrying, one failed; archive: sent
    status = {s.destination: s for s in rows.status()}
    pacs, archive = status["pacs"], status["archive"]
    assert (pacs.pending, pacs.retrying, pacs.failed_permanent, pacs.sending) == (1, 1, 1, 0)
    assert pacs.oldest_pending == T0 and pacs.failing_since == T0
    assert pacs.last_error == "scripted permanent"  # the most recent failure
    assert (archive.pending, archive.retrying, archive.failed_permanent) == (0, 0, 0)
    assert archive.oldest_pending is None and archive.failing_since is None

    by_state = {r.state: r for r in rows.items(destination="pacs")}
    failed, waiting = by_state[OutboxState.FAILED_PERMANENT], by_state[OutboxState.PENDING]
    later = T0 + dt.timedelta(seconds=1)
    item, previous = rows.retry(failed.id, now=later)
    assert previous is OutboxState.FAILED_PERMANENT
    assert (item.state, item.attempts, item.next_attempt_at) == (OutboxState.PENDING, 0, later)
    item, previous = rows.retry(waiting.id, now=later)  # backing off: due now instead
    assert previous is OutboxState.PENDING and item.next_attempt_at == later
    assert item.attempts == 1
    sent = next(r for r in rows.items(destination="archive"))
    for refused in (sent.id, 999_999):
        with pytest.raises(StoreError) as caught:
            rows.retry(refused, now=later)
        code = "outbox_not_retryable" if refused == sent.id else "outbox_item_not_found"
        assert caught.value.code == code
    report = _outbox(rows, ScriptedSender()).deliver_pending(later)
    assert report.sent == 2 and {s.destination: s.pending for s in rows.status()}["pacs"] == 0


def test_rows_survive_a_restart(db, tmp_path) -> None:
    store, rows = db
    _outbox(rows, ScriptedSender()).enqueue([_result(tmp_path)], now=T0)
    url = store.engine.url
    store.close()
    reopened = init_store(url.render_as_string(hide_password=False))
    try:
        sender = ScriptedSender()
        report = _outbox(OutboxStore(reopened.engine), sender).deliver_pending(T0)
        assert report.sent == 2 and len(sender.sent) == 2
    finally:
        reopened.close()


def test_a_sender_bug_reschedules_rather_than_strands(db, tmp_path) -> None:
    _, rows = db

    class Broken:
        def send(self, destination, files, on_result, *, still_ours=None) -> None:
            raise RuntimeError("bug")

    outbox = _outbox(rows, Broken())
    outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=T0)
    assert outbox.deliver_pending(T0).retried == 1
    [item] = rows.items()
    assert item.state is OutboxState.PENDING and "internal error" in (item.last_error or "")
    assert rows.next_due() == T0 + dt.timedelta(seconds=30)


def test_concurrent_workers_claim_disjoint_rows(db, tmp_path) -> None:
    _, rows = db
    outbox = _outbox(rows, ScriptedSender())
    outbox.enqueue([_result(tmp_path) for _ in range(10)], now=T0)
    claims: list[list[int]] = []
    barrier = threading.Barrier(3)

    def claim() -> None:
        barrier.wait()
        claims.append([item.id for item in rows.claim_due(T0, limit=20)])

    threads = [threading.Thread(target=claim) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    claimed = [item_id for ids in claims for item_id in ids]
    assert len(claimed) == len(set(claimed)) == 20


def test_an_urgent_jobs_results_are_claimed_before_older_routine_ones(db, tmp_path) -> None:
    """Class first, then oldest first: a backlog of routine results (and rows of no job)
    does not hold back an URGENT study's SEG; within a class the oldest goes first."""
    store, rows = db
    outbox = _outbox(rows, ScriptedSender())

    def job(cls: PriorityClass) -> str:
        return store.create_job(
            priority_class=cls,
            deadline=dt.timedelta(seconds=1800),
            pipeline_name="ct-chest-abdomen",
            pipeline_version="1.0",
            precision="fp32",
            fingerprint="f" * 64,
            study_path="studies/ff",
        ).id

    routine, inpatient, urgent = job(OUT), job(INP), job(URG)
    at = [T0 + dt.timedelta(seconds=s) for s in range(6)]
    [old] = outbox.enqueue([_result(tmp_path)], destinations=["pacs"], job_id=routine, now=at[0])
    [loose] = outbox.enqueue([_result(tmp_path)], destinations=["pacs"], now=at[1])
    [ward] = outbox.enqueue([_result(tmp_path)], destinations=["pacs"], job_id=inpatient, now=at[2])
    [new] = outbox.enqueue([_result(tmp_path)], destinations=["pacs"], job_id=routine, now=at[3])
    [stat] = outbox.enqueue([_result(tmp_path)], destinations=["pacs"], job_id=urgent, now=at[4])
    [first, second] = rows.claim_due(at[5], limit=2)
    assert (first.id, second.id) == (stat.id, ward.id)
    assert [item.id for item in rows.claim_due(at[5])] == [old.id, loose.id, new.id]
