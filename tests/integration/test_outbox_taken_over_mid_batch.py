"""A DICOM outbox batch leaves to another sender the files it took over mid-batch:
before each C-STORE on the batch's association the sender reads its row back, and a row
another sender now holds is skipped, not stored a second time at the PACS.

Found on 2026-12-07: the DICOM outbox sent a claimed batch's files on one association
and checked nothing between them (the lease renewal of 9195131 only kept its own rows'
lease; its ``hold`` check before each send was used by the critical and FHIR senders
only, and it sees a take-over only at the next renewal). A second sender whose clock
runs ahead of the first's by more than a lease (the senders' clocks disagree; or the
first stalled) claims the rows the first has not stored yet and stores them; the first
went on and stored every one of them too: 10 of 12 files reached the PACS twice here.

Two senders on one database (SQLite; PostgreSQL when configured), a real slow PACS (a
pynetdicom acceptor on loopback answering each C-STORE after a pause). The second
sender claims with its clock an hour ahead, once the first batch is going out."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.awkward_peer import scripted_peer
from tests.factories.postgres import store_on
from tests.factories.waits import until

from radserve.gateway.outbox import DeliveryReport, Outbox, RetryPolicy, utc_now
from radserve.gateway.scu import StoreSCU
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.store import Store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

FILES = 12
ANSWER_DELAY_S = 0.3  # the PACS answers each C-STORE after this pause
NO_RETRY_SOON = RetryPolicy(first_delay_s=3600.0, max_delay_s=3600.0)
STUCK_S = 60.0  # a bound for a stuck test only


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_outbox_taken") as opened:
        yield opened


def test_a_file_another_sender_took_over_mid_batch_is_not_stored_twice(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway.lease_keeper")
    phantom = generate_phantom(PhantomSpec.random(7, small=True), range(10, 10 + FILES))
    files = write_dicom_series(phantom, tmp_path / "study")
    with scripted_peer(delay_s=ANSWER_DELAY_S) as peer:
        first, second = (
            Outbox(
                OutboxStore(store.engine, instance=name),
                [peer.destination],
                StoreSCU(),
                policy=NO_RETRY_SOON,
            )
            for name in ("a", "b")
        )
        first.enqueue(files)
        reports: dict[str, DeliveryReport] = {}
        sending = threading.Thread(target=lambda: reports.update(a=first.deliver_pending()))
        sending.start()
        until(lambda: len(peer.received) >= 2, "the first sender's batch going out", 30)
        ahead = utc_now() + first.lease + dt.timedelta(hours=1)  # its clock an hour ahead
        reports["b"] = second.deliver_pending(ahead)
        sending.join(STUCK_S)
        assert not sending.is_alive()
        stored = Counter(str(dataset.SOPInstanceUID) for dataset in peer.received)
    first_report, second_report = reports["a"], reports["b"]
    assert len(stored) == FILES  # every file reached the PACS
    twice = [uid for uid, times in stored.items() if times > 1]
    # at most the one file the first sender was storing when the second took over
    assert len(twice) <= 1, stored
    assert second_report.claimed >= FILES - 2 - 1 and second_report.sent == second_report.claimed
    assert first_report.taken_over >= second_report.claimed - 1
    assert first_report.claimed == FILES
    rows = OutboxStore(store.engine).items(kind=OutboxKind.DICOM)
    assert {row.state for row in rows} == {OutboxState.SENT}
    skipped = [r for r in caplog.records if "taken over by another sender" in r.getMessage()]
    assert len(skipped) == first_report.taken_over
