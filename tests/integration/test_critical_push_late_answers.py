"""An acknowledgement that comes after its notice was settled by another sender is not
recorded a second time.

Probe of session 37: a receiver slower than the outbox lease (a critical receiver's
``timeout_s`` may be up to a year; the lease is ``outbox.lease_s``): the row's lease ran
out while the first send waited, a second sender (another replica) took the row, sent it
and had it acknowledged; then the first answer came. The store did not move the row
again, but the outbox told its listener all the same: two ``critical.acknowledged``
records, two ``sent`` counts and two latencies for one notice (a late failure was
audited ``critical.failed`` for an acknowledged notice). Two outboxes on one SQLite
database, one real loopback receiver."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.waits import until

from radserve.critical.push import CriticalOutbox, Receiver
from radserve.gateway.outbox import utc_now
from radserve.gateway.scu import Outcome, SendResult
from radserve.store import init_store
from radserve.store.outbox import OutboxItem, OutboxKind, OutboxState, OutboxStore


def test_a_late_acknowledgement_of_a_notice_taken_over_is_not_recorded_twice(
    tmp_path: Path,
) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    told: list[tuple[str, Outcome]] = []

    def listener(item: OutboxItem, outcome: Outcome, _r: SendResult, _at: dt.datetime) -> None:
        told.append((item.sop_instance_uid, outcome))

    try:
        with FhirServer() as receiver:
            receiver.script(Answer(delay_s=3.0), Answer())  # the first send waits 3 s
            boxes = [
                CriticalOutbox(
                    OutboxStore(store.engine, instance=name),
                    [Receiver("ward", receiver.url, timeout_s=30.0)],
                    on_settled=listener,
                )
                for name in ("a", "b")
            ]
            first, second = boxes
            notice = {"id": "notice-1", "study_instance_uid": "1.2.3", "job_id": "job-1"}
            first.enqueue(notice, folder=tmp_path / "out", job_id="job-1")
            sending = threading.Thread(target=first.deliver_pending)
            sending.start()
            until(lambda: len(receiver.received) == 1, "the first send at the receiver", 15)
            # its lease has run out (as it would during a slow answer): the other takes it
            later = utc_now() + first.lease + dt.timedelta(seconds=1)
            assert second.deliver_pending(later).sent == 1
            sending.join(30)
            assert not sending.is_alive()
            for box in boxes:
                box.close()
        (row,) = OutboxStore(store.engine).items(kind=OutboxKind.CRITICAL)
        assert row.state is OutboxState.SENT
        assert len(receiver.received) == 2  # both sends reached it
        assert told == [("notice-1", Outcome.SENT)]  # one acknowledgement recorded
    finally:
        store.close()
