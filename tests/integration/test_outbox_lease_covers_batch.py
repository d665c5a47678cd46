"""A batch's lease covers the sends made under it: a second sender never takes over rows
the first is still working through, however slow the receiver, so nothing is sent twice.

Found on 2026-12-06: critical notices were claimed 20 at a time under one fixed lease
(5 minutes; ``outbox.lease_s`` in a server) while each send may take up to its
receiver's ``timeout_s`` (up to 300 s). A batch outlived its lease: another sender (a
replica, or the same server restarted) took the rows still waiting, and the receiver got
those critical findings twice. The FHIR and DICOM outboxes had the same pattern. Now the lease
covers one attempt at least and is renewed as the batch goes out
(radserve.gateway.lease_keeper).

Two senders on one database (SQLite; PostgreSQL when configured), a real loopback HTTP
receiver that answers each POST after a pause. The configured lease (0.2 s) is shorter
than one answer, and the batch takes longer than a lease covering one attempt: only
renewal keeps it. The second sender looks for due rows once the first batch is going
out, until it has gone."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest
from tests.factories.awkward_peer import scripted_peer
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.postgres import store_on
from tests.factories.waits import until

from radserve.critical.push import CriticalOutbox, Receiver
from radserve.fhir.delivery import FhirDestination, FhirOutbox
from radserve.gateway.outbox import DeliveryReport, Outbox, RetryPolicy
from radserve.gateway.scu import StoreSCU
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.store import Store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

NOTICES = 12
ANSWER_DELAY_S = 0.4  # each POST is answered after this pause
TIMEOUT_S = 2.0  # the receiver's timeout: the batch (~4.8 s) outlasts 2 x 2 s
CONFIGURED_LEASE = dt.timedelta(seconds=0.2)  # shorter than one answer
NO_RETRY_SOON = RetryPolicy(first_delay_s=3600.0, max_delay_s=3600.0)
PACS_ANSWER_DELAY_S = 0.5  # each C-STORE is answered after this pause
STUCK_S = 60.0  # a bound for a stuck test only


class _Sender(Protocol):
    lease: dt.timedelta

    def deliver_pending(self) -> DeliveryReport: ...

    def close(self) -> None: ...


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_outbox_lease") as opened:
        yield opened


def _critical(store: Store, url: str, tmp_path: Path) -> tuple[list[_Sender], OutboxKind]:
    boxes = [
        CriticalOutbox(
            OutboxStore(store.engine, instance=name),
            [Receiver("ward", url, timeout_s=TIMEOUT_S)],
            policy=NO_RETRY_SOON,
            lease=CONFIGURED_LEASE,
        )
        for name in ("a", "b")
    ]
    for n in range(NOTICES):
        notice = {"id": f"notice-{n}", "study_instance_uid": "1.2.3", "job_id": f"job-{n}"}
        boxes[0].enqueue(notice, folder=tmp_path / "out")
    return list(boxes), OutboxKind.CRITICAL


def _fhir(store: Store, url: str, tmp_path: Path) -> tuple[list[_Sender], OutboxKind]:
    destination = FhirDestination(url=url, timeout_s=TIMEOUT_S)
    boxes = [
        FhirOutbox(
            OutboxStore(store.engine, instance=name),
            destination,
            policy=NO_RETRY_SOON,
            lease=CONFIGURED_LEASE,
        )
        for name in ("a", "b")
    ]
    for n in range(NOTICES):
        bundle = {"resourceType": "Bundle", "id": f"bundle-{n}", "type": "transaction"}
        boxes[0].enqueue(bundle, folder=tmp_path / "out")
    return list(boxes), OutboxKind.FHIR


Setup = Callable[[Store, str, Path], tuple[list[_Sender], OutboxKind]]


@pytest.mark.parametrize("setup", [_critical, _fhir], ids=["critical", "fhir"])
def test_a_second_sender_never_takes_rows_a_slow_batch_is_still_sending(
    store: Store, tmp_path: Path, setup: Setup
) -> None:
    with FhirServer() as receiver:
        receiver.script(*[Answer(delay_s=ANSWER_DELAY_S)] * (2 * NOTICES))
        (first, second), kind = setup(store, receiver.url, tmp_path)
        try:
            reports: list[DeliveryReport] = []
            sending = threading.Thread(target=lambda: reports.append(first.deliver_pending()))
            sending.start()
            until(lambda: len(receiver.received) >= 1, "the first sender's batch going out", 30)
            taken_by_second = 0
            while sending.is_alive():  # the other replica looks for due rows meanwhile
                taken_by_second += second.deliver_pending().claimed
                sending.join(0.05)
            sending.join(STUCK_S)
            assert not sending.is_alive()
        finally:
            first.close()
            second.close()
        bodies = [r.json() for r in receiver.received]
    times_received = Counter(body["id"] for body in bodies)
    assert taken_by_second == 0
    assert set(times_received.values()) == {1}, times_received  # each once, none twice
    assert len(times_received) == NOTICES
    assert reports[0].sent == NOTICES
    rows = OutboxStore(store.engine).items(kind=kind)
    assert {row.state for row in rows} == {OutboxState.SENT}
    assert {row.attempts for row in rows} == {1}
    assert first.lease >= dt.timedelta(seconds=2 * TIMEOUT_S)  # covers one attempt at least


def test_a_second_sender_never_takes_files_a_slow_pacs_is_still_storing(
    store: Store, tmp_path: Path
) -> None:
    """The DICOM outbox: 100 files a batch under one lease, each C-STORE up to the
    gateway's timeouts. A PACS answering each C-STORE after a pause, a batch longer
    than a lease covering one file's C-STORE (its connect, A-ASSOCIATE, DIMSE and
    network timeouts)."""
    phantom = generate_phantom(PhantomSpec.random(5, small=True))  # 60 slices
    files = write_dicom_series(phantom, tmp_path / "study")
    timeouts = {
        "connect_timeout_s": 2.0,
        "acse_timeout_s": 2.0,
        "dimse_timeout_s": 3.0,
        "network_timeout_s": 3.0,
    }  # one file's C-STORE: 10 s at most, so the lease covers 20 s; the batch takes ~30 s.
    # Every timeout is 4-6x what a quiet host needs: at CI load a 1 s DIMSE timeout against
    # a 0.4 s pause (2026-12-07), then a 0.5 s A-ASSOCIATE timeout (the same day, helpers
    # beside CI) failed the first attempt: a retry the property under test is not about.
    with scripted_peer(delay_s=PACS_ANSWER_DELAY_S) as peer:
        first, second = (
            Outbox(
                OutboxStore(store.engine, instance=name),
                [peer.destination],
                StoreSCU(**timeouts),
                policy=NO_RETRY_SOON,
                lease=CONFIGURED_LEASE,
            )
            for name in ("a", "b")
        )
        first.enqueue(files)
        reports: list[DeliveryReport] = []
        sending = threading.Thread(target=lambda: reports.append(first.deliver_pending()))
        sending.start()
        until(lambda: len(peer.received) >= 1, "the first sender's batch going out", 30)
        taken_by_second = 0
        while sending.is_alive():
            taken_by_second += second.deliver_pending().claimed
            sending.join(0.05)
        sending.join(STUCK_S)
        assert not sending.is_alive()
        stored = Counter(str(dataset.SOPInstanceUID) for dataset in peer.received)
    assert taken_by_second == 0
    assert set(stored.values()) == {1}, stored
    assert len(stored) == len(files)
    assert reports[0].sent == len(files)
    rows = OutboxStore(store.engine).items(kind=OutboxKind.DICOM)
    assert {row.state for row in rows} == {OutboxState.SENT}
    assert first.lease >= dt.timedelta(seconds=20.0)
