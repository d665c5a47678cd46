"""The critical-notice and FHIR senders leave to another sender the rows it took over
mid-batch: before each POST the sender reads its row back, and a row another sender now
holds is skipped, not posted a second time.

Found on 2026-12-07 (after 89b06db gave the DICOM outbox this check): both senders
checked only :meth:`~radserve.gateway.lease_keeper.LeaseKeeper.hold` before each POST,
which sees a take-over at the next lease renewal only. A second sender whose clock runs
ahead of the first's by more than a lease (the senders' clocks disagree, or the first
stalled) claims the rows the first has not posted yet and posts them; the first went on
and posted every one of them too: 10 of 12 critical findings paged twice, 10 of 12 FHIR
Bundles posted twice.

Two senders on one database (SQLite; PostgreSQL when configured), a real loopback HTTP
receiver that answers each POST after a pause. The second sender claims with its clock an
hour ahead, once the first batch is going out."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.postgres import store_on
from tests.factories.waits import until

from radserve.critical.push import CriticalOutbox, Receiver
from radserve.fhir.delivery import FhirDestination, FhirOutbox
from radserve.gateway.outbox import DeliveryReport, RetryPolicy, utc_now
from radserve.store import Store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

ROWS = 12
ANSWER_DELAY_S = 0.3  # the receiver answers each POST after this pause
NO_RETRY_SOON = RetryPolicy(first_delay_s=3600.0, max_delay_s=3600.0)
STUCK_S = 60.0  # a bound for a stuck test only


class _Sender(Protocol):
    lease: dt.timedelta

    def deliver_pending(self, now: dt.datetime | None = None) -> DeliveryReport: ...

    def close(self) -> None: ...


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_http_taken") as opened:
        yield opened


def _critical(store: Store, url: str, tmp_path: Path) -> tuple[list[_Sender], OutboxKind]:
    boxes = [
        CriticalOutbox(
            OutboxStore(store.engine, instance=name),
            [Receiver("ward", url, timeout_s=10.0)],
            policy=NO_RETRY_SOON,
        )
        for name in ("a", "b")
    ]
    for n in range(ROWS):
        notice = {"id": f"notice-{n}", "study_instance_uid": "1.2.3", "job_id": f"job-{n}"}
        boxes[0].enqueue(notice, folder=tmp_path / "out")
    return list(boxes), OutboxKind.CRITICAL


def _fhir(store: Store, url: str, tmp_path: Path) -> tuple[list[_Sender], OutboxKind]:
    destination = FhirDestination(url=url, timeout_s=10.0)
    boxes = [
        FhirOutbox(OutboxStore(store.engine, instance=name), destination, policy=NO_RETRY_SOON)
        for name in ("a", "b")
    ]
    for n in range(ROWS):
        bundle = {"resourceType": "Bundle", "id": f"bundle-{n}", "type": "transaction"}
        boxes[0].enqueue(bundle, folder=tmp_path / "out")
    return list(boxes), OutboxKind.FHIR


Setup = Callable[[Store, str, Path], tuple[list[_Sender], OutboxKind]]


@pytest.mark.parametrize("setup", [_critical, _fhir], ids=["critical", "fhir"])
def test_a_row_another_sender_took_over_mid_batch_is_not_posted_twice(
    store: Store, tmp_path: Path, setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway.lease_keeper")
    with FhirServer() as receiver:
        (first, second), kind = setup(store, receiver.url, tmp_path)
        receiver.script(*[Answer(delay_s=ANSWER_DELAY_S)] * (2 * ROWS))
        try:
            reports: dict[str, DeliveryReport] = {}
            sending = threading.Thread(target=lambda: reports.update(a=first.deliver_pending()))
            sending.start()
            # the first notice answered and recorded, the second in flight; a notice
            # answered but not yet recorded (the critical lane's group commit) may go
            # twice by design, as after a crash between a send and its commit
            recorded = OutboxStore(store.engine)
            until(
                lambda: (
                    len(receiver.received) >= 2
                    and recorded.items(kind=kind, state=OutboxState.SENT)
                ),
                "the first sender's batch going out",
                30,
            )
            ahead = utc_now() + first.lease + dt.timedelta(hours=1)  # its clock an hour ahead
            reports["b"] = second.deliver_pending(ahead)
            sending.join(STUCK_S)
            assert not sending.is_alive()
        finally:
            first.close()
            second.close()
        posted = Counter(r.json()["id"] for r in receiver.received)
    first_report, second_report = reports["a"], reports["b"]
    assert len(posted) == ROWS  # every row reached the receiver
    twice = [row_id for row_id, times in posted.items() if times > 1]
    # at most the one the first sender was posting when the second took over
    assert len(twice) <= 1, posted
    assert second_report.claimed >= ROWS - 2 - 1 and second_report.sent == second_report.claimed
    assert first_report.claimed == ROWS
    assert first_report.taken_over >= second_report.claimed - 1
    rows = OutboxStore(store.engine).items(kind=kind)
    assert {row.state for row in rows} == {OutboxState.SENT}
    skipped = [r for r in caplog.records if "taken over by another sender" in r.getMessage()]
    assert len(skipped) == first_report.taken_over
