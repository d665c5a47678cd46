"""Storage commitment against a real Orthanc 1.10.1 on loopback: radserve stores its SEG
and SR, asks for commitment (N-ACTION) and counts them delivered only once Orthanc's
N-EVENT-REPORT, which Orthanc sends on a new association to radserve's SCP, lists them
committed. A Lua filter that drops the SEG after answering C-STORE success makes the
report list it failed (0x0112): the SEG is sent again and, its retries spent, failed with
that reason; no report within the timeout: sent again with that reason. Reports are
matched by their persisted Transaction UID, so one arriving after a restart settles its
rows; an unknown transaction, or one reported by another peer, is answered 0x0115."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pydicom
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pydicom.dataset import Dataset
from pynetdicom import AE, ALL_TRANSFER_SYNTAXES, build_role, evt
from tests.factories.dicom_net import Orthanc, study_with_results
from tests.factories.pacs import RecordingSCU, committing_pacs, pacs_marks
from tests.factories.postgres import postgres_schema
from tests.factories.service import settings_for
from tests.factories.waits import until

from radserve.gateway import Destination, GatewaySCP, Outbox, Peer, RetryPolicy, ScpConfig, StoreSCU
from radserve.gateway.commitment import PUSH_MODEL, PUSH_MODEL_INSTANCE
from radserve.gateway.conformance import COMPREHENSIVE_3D_SR, SEGMENTATION, Status
from radserve.gateway.outbox import LaneWorkers
from radserve.service.metrics import SenderCollector, _OutboxCollector
from radserve.service.outbox import OutboxOps
from radserve.store import init_store
from radserve.store.audited import open_audited
from radserve.store.errors import OutboxNotRetryableError
from radserve.store.outbox import OutboxItem, OutboxState, OutboxStore

pytestmark = pacs_marks()

DROP_SEG = """
function ReceivedInstanceFilter(dicom, origin, info)
  return dicom.Modality ~= 'SEG'
end
"""


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    _, paths = study_with_results(tmp_path_factory.mktemp("results"))
    return paths


def _modality(path: Path) -> str:
    return str(pydicom.dcmread(path, stop_before_pixels=True).Modality)


def _by_modality(rows: OutboxStore) -> dict[str, OutboxItem]:
    return {_modality(Path(item.path)): item for item in rows.items()}


def test_results_count_as_delivered_once_orthanc_reports_them_committed(
    tmp_path: Path, results: list[Path]
) -> None:
    with committing_pacs(tmp_path) as (orthanc, outbox, rows, _scp):
        outbox.enqueue(results, now=utc_now())
        report = outbox.deliver_pending(utc_now())
        assert report.claimed == len(results) and report.committing >= 1
        until(
            lambda: all(item.state is OutboxState.SENT for item in rows.items()),
            "Orthanc's storage commitment report settles every row",
        )
        stored = set(orthanc.get("/instances"))
    assert len(stored) == len(results)
    for item in rows.items():
        assert item.attempts == 1 and item.last_error is None and item.commitment_uid


def test_once_orthanc_reported_on_its_own_association_no_batch_waits_on_the_n_action_one(
    tmp_path: Path, results: list[Path]
) -> None:
    scu = RecordingSCU()
    with committing_pacs(tmp_path, scu=scu) as (orthanc, outbox, rows, _scp):
        for n, path in enumerate(results):  # one batch each
            outbox.enqueue([path], now=utc_now())
            assert outbox.deliver_pending(utc_now()).committing == 1
            until(
                lambda n=n: len(rows.items(state=OutboxState.SENT)) == n + 1,
                "Orthanc's report, on an association of its own, settles the batch",
            )
        stored = len(orthanc.get("/instances"))
    # the first batch after a start waits (a peer may report there); Orthanc reports on
    # a new association, so the next ones release the N-ACTION's association at once
    assert scu.waited == [True] + [False] * (len(results) - 1)
    assert stored == len(results)


def test_a_seg_a_filter_drops_after_c_store_success_is_sent_again_then_failed_with_the_reason(
    tmp_path: Path, results: list[Path]
) -> None:
    with committing_pacs(tmp_path, lua=DROP_SEG, attempts=2) as (_orthanc, outbox, rows, _):
        outbox.enqueue(results, now=utc_now())
        outbox.deliver_pending(utc_now())
        first = until(
            lambda: (lambda items: items if items["SEG"].state is OutboxState.PENDING else None)(
                _by_modality(rows)
            ),
            "the report lists the SEG failed",
        )
        assert first["SR"].state is OutboxState.SENT
        seg = first["SEG"]
        assert "0x0112 (no such object instance)" in (seg.last_error or "")
        assert "answered C-STORE success" in (seg.last_error or "")
        outbox.deliver_pending(seg.next_attempt_at)  # sent again: dropped again
        final = until(
            lambda: (lambda item: item if item.state is OutboxState.FAILED_PERMANENT else None)(
                rows.get(seg.id)
            ),
            "the SEG fails for good after its retries",
        )
    assert final.attempts == 2
    assert final.last_error is not None and final.last_error.startswith("gave up after 2")
    assert "0x0112" in final.last_error


def test_no_report_within_the_timeout_sends_the_results_again(
    tmp_path: Path, results: list[Path]
) -> None:
    # radserve's SCP is not listening: Orthanc cannot deliver its report
    with committing_pacs(tmp_path, scp_running=False, timeout_s=5.0) as (_o, outbox, rows, _):
        start = utc_now()
        outbox.enqueue(results, now=start)
        outbox.deliver_pending(start)
        waiting = rows.items()
        assert {item.state for item in waiting} == {OutboxState.COMMITTING}
        [status] = rows.status()  # operators see them waiting, not delivered
        assert (status.committing, status.pending, status.sending) == (len(results), 0, 0)
        assert status.oldest_pending is not None
        exposition = _metrics(rows)
        assert f'radserve_outbox_pending{{destination="pacs",kind="dicom"}} {len(results)}.0' in (
            exposition
        )
        deadline = max(item.next_attempt_at for item in waiting)
        assert outbox.next_due() == min(item.next_attempt_at for item in waiting)
        assert outbox.deliver_pending(deadline - dt.timedelta(seconds=1)).retried == 0
        report = outbox.deliver_pending(deadline)
    assert report.retried == len(results)
    for item in rows.items():
        assert item.state is OutboxState.PENDING and item.attempts == 1
        assert "no storage commitment report from pacs within 5 s" in (item.last_error or "")


def _metrics(rows: OutboxStore) -> str:
    registry = CollectorRegistry()
    registry.register(_OutboxCollector(rows.status))
    return generate_latest(registry).decode()


def _report(port: int, calling: str, transaction_uid: str, items: list[OutboxItem]) -> int:
    """Send an N-EVENT-REPORT to radserve's SCP as a storage commitment SCP would on an
    association of its own (the SCP role proposed); the answer's status."""
    ae = AE(ae_title=calling)
    ae.add_requested_context(PUSH_MODEL)
    assoc = ae.associate(
        "127.0.0.1",
        port,
        ae_title="RADSERVE",
        ext_neg=[build_role(PUSH_MODEL, scu_role=False, scp_role=True)],
    )
    assert assoc.is_established
    info = Dataset()
    info.TransactionUID = transaction_uid
    references = []
    for item in items:
        reference = Dataset()
        reference.ReferencedSOPClassUID = item.sop_class_uid
        reference.ReferencedSOPInstanceUID = item.sop_instance_uid
        references.append(reference)
    info.ReferencedSOPSequence = references
    try:
        status, _ = assoc.send_n_event_report(info, 1, PUSH_MODEL, PUSH_MODEL_INSTANCE)
        return int(status.Status)
    finally:
        assoc.release()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'radserve.db'}"
        return
    with postgres_schema("radserve_commitment") as url:
        yield url


def test_a_report_arriving_after_a_restart_is_matched_and_strangers_are_refused(
    tmp_path: Path, results: list[Path], caplog: pytest.LogCaptureFixture, database_url: str
) -> None:
    with committing_pacs(tmp_path, scp_running=False, database_url=database_url) as (
        _orthanc,
        outbox,
        rows,
        _,
    ):
        outbox.enqueue(results, now=utc_now())
        outbox.deliver_pending(utc_now())
        waiting = rows.items()
        [transaction] = {item.commitment_uid for item in waiting}
        assert transaction is not None
    # a new process: the rows and their transaction come from the database alone
    store = init_store(database_url)
    try:
        restarted = Outbox(
            OutboxStore(store.engine),
            [
                Destination(
                    name="pacs",
                    ae_title="ORTHANC",
                    host="127.0.0.1",
                    port=1,
                    storage_commitment=True,
                )
            ],
            StoreSCU(),
        )
        config = ScpConfig(
            data_dir=tmp_path / "restarted",
            port=0,
            allowed_peers=[Peer("ORTHANC", "127.0.0.1"), Peer("OTHER", "127.0.0.1")],
        )
        with GatewaySCP(
            config, lambda _: None, on_commitment=restarted.commitments.on_report
        ) as server:
            port = server.address[1]
            assert _report(port, "OTHER", transaction, waiting) == Status.INVALID_ARGUMENT
            assert _report(port, "ORTHANC", "2.25.1234", waiting) == Status.INVALID_ARGUMENT
            assert {i.state for i in restarted.store.items()} == {OutboxState.COMMITTING}
            assert _report(port, "ORTHANC", transaction, waiting) == 0
            settled = restarted.store.items()
    finally:
        store.close()
    assert {item.state for item in settled} == {OutboxState.SENT}
    assert "radserve never asked for it" in caplog.text
    assert "not from the destination it was asked of" in caplog.text


@contextmanager
def _same_association_peer(commit: bool) -> Iterator[tuple[Destination, list[int]]]:
    """A pynetdicom Storage SCP that is also a storage commitment SCP and reports on the
    N-ACTION's own association (as PS3.4 J.3.3 allows), committing every instance or
    none (0x0110); yields the destination and the statuses radserve answered."""
    answers: list[int] = []
    ae = AE(ae_title="SAMEASSOC")
    for sop_class in (SEGMENTATION, COMPREHENSIVE_3D_SR):
        ae.add_supported_context(sop_class, ALL_TRANSFER_SYNTAXES)
    ae.add_supported_context(PUSH_MODEL, scu_role=True, scp_role=True)

    def report(assoc: Any, request: Dataset) -> None:
        info = Dataset()
        info.TransactionUID = request.TransactionUID
        info.ReferencedSOPSequence = list(request.ReferencedSOPSequence) if commit else []
        failed = []
        for reference in [] if commit else request.ReferencedSOPSequence:
            item = Dataset()
            item.ReferencedSOPClassUID = reference.ReferencedSOPClassUID
            item.ReferencedSOPInstanceUID = reference.ReferencedSOPInstanceUID
            item.FailureReason = 0x0110
            failed.append(item)
        if failed:
            info.FailedSOPSequence = failed
        status, _ = assoc.send_n_event_report(
            info, 1 if commit else 2, PUSH_MODEL, PUSH_MODEL_INSTANCE
        )
        answers.append(int(status.Status))

    def on_action(event: Any) -> tuple[int, None]:
        request = event.action_information
        threading.Timer(0.05, report, (event.assoc, request)).start()
        return 0x0000, None

    server = ae.start_server(
        ("127.0.0.1", 0),
        block=False,
        evt_handlers=[(evt.EVT_C_STORE, lambda _e: 0x0000), (evt.EVT_N_ACTION, on_action)],
    )
    try:
        port = server.server_address[1]
        yield (
            Destination(
                name="same",
                ae_title="SAMEASSOC",
                host="127.0.0.1",
                port=port,
                storage_commitment=True,
            ),
            answers,
        )
    finally:
        server.shutdown()


@pytest.mark.parametrize("commit", [True, False])
def test_a_report_on_the_n_action_association_settles_the_rows_there(
    tmp_path: Path, results: list[Path], commit: bool
) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        with _same_association_peer(commit) as (destination, answers):
            rows = OutboxStore(store.engine)
            outbox = Outbox(rows, [destination], StoreSCU(), policy=RetryPolicy())
            outbox.enqueue(results, now=utc_now())
            report = outbox.deliver_pending(utc_now())
            items = rows.items()
    finally:
        store.close()
    assert answers == [0]
    assert outbox.commitments.waits_for_report(destination)  # it reports there: keep waiting
    if commit:
        assert report.sent == len(results) and report.committing == 0
        assert {item.state for item in items} == {OutboxState.SENT}
    else:
        assert report.retried == len(results)
        assert {item.state for item in items} == {OutboxState.PENDING}
        assert all("0x0110 (processing failure)" in (i.last_error or "") for i in items)


@contextmanager
def _reported_by_hand(
    tmp_path: Path, database_url: str, *, timeout_s: float = 5.0
) -> Iterator[tuple[Orthanc, Outbox, OutboxStore, int]]:
    """:func:`committing_pacs` whose reports Orthanc cannot deliver (its SCP is not
    listening), and a radserve SCP of its own that settles the outbox's commitments: its
    port, for :func:`_report`."""
    with committing_pacs(
        tmp_path, scp_running=False, timeout_s=timeout_s, database_url=database_url
    ) as (orthanc, outbox, rows, _):
        config = ScpConfig(
            data_dir=tmp_path / "reports",
            port=0,
            allowed_peers=[Peer("ORTHANC", "127.0.0.1"), Peer("OTHER", "127.0.0.1")],
        )
        on_report = outbox.commitments.on_report
        with GatewaySCP(config, lambda _: None, on_commitment=on_report) as server:
            yield orthanc, outbox, rows, server.address[1]


def _timed_out(
    outbox: Outbox, rows: OutboxStore, results: list[Path]
) -> tuple[list[OutboxItem], str, dt.datetime]:
    """``results`` stored by Orthanc, their commitment asked and no report by the
    deadline (rescheduled): the rows as asked, the transaction, the deadline."""
    start = utc_now()
    outbox.enqueue(results, now=start)
    outbox.deliver_pending(start)
    asked = rows.items()
    [transaction] = {item.commitment_uid for item in asked}
    assert transaction is not None
    deadline = max(item.next_attempt_at for item in asked)
    assert outbox.deliver_pending(deadline).retried == len(results)
    return asked, transaction, deadline


def test_a_committed_report_after_the_deadline_cancels_the_re_send_not_yet_made(
    tmp_path: Path, results: list[Path], caplog: pytest.LogCaptureFixture, database_url: str
) -> None:
    with _reported_by_hand(tmp_path, database_url) as (orthanc, outbox, rows, port):
        asked, transaction, deadline = _timed_out(outbox, rows, results)
        assert {item.state for item in rows.items()} == {OutboxState.PENDING}
        assert _report(port, "ORTHANC", transaction, asked) == Status.SUCCESS
        settled = rows.items()
        later = outbox.deliver_pending(deadline + dt.timedelta(hours=1))
        held = len(orthanc.get("/instances"))
    assert {item.state for item in settled} == {OutboxState.SENT}
    for item in settled:
        assert item.attempts == 1 and item.sent_at is not None
        assert "(deadline passed, or retried by an operator): the re-send was cancelled" in (
            item.last_error or ""
        )
    assert later.claimed == 0  # nothing is sent a second time
    assert held == len(results)
    assert outbox.commitments.late_reports == {"pacs": 1}
    registry = CollectorRegistry()
    registry.register(SenderCollector(LaneWorkers(outbox, ["pacs"], prefix="t").senders))
    exposition = generate_latest(registry).decode()
    late = 'radserve_storage_commitment_late_reports_total{destination="pacs",kind="dicom"} 1.0'
    assert late in exposition
    assert f"{len(results)} re-send(s) cancelled, 0 already sent again" in caplog.text


def test_a_committed_report_after_the_re_send_counts_it_delivered_and_names_the_duplicate(
    tmp_path: Path, results: list[Path], caplog: pytest.LogCaptureFixture, database_url: str
) -> None:
    with _reported_by_hand(tmp_path, database_url) as (_orthanc, outbox, rows, port):
        first, transaction, _deadline = _timed_out(outbox, rows, results)
        due = max(item.next_attempt_at for item in rows.items())
        assert outbox.deliver_pending(due).committing == len(results)  # sent again
        again = rows.items()
        [second] = {item.commitment_uid for item in again}
        assert second not in (None, transaction)
        assert {item.attempts for item in again} == {2}
        assert _report(port, "ORTHANC", transaction, first) == Status.SUCCESS
        settled = rows.items()
        # the second transaction's report finds them delivered: success, nothing changes
        assert _report(port, "ORTHANC", second, again) == Status.SUCCESS
        assert rows.items() == settled
        assert _report(port, "ORTHANC", "2.25.98765", again) == Status.INVALID_ARGUMENT
        assert _report(port, "OTHER", transaction, first) == Status.INVALID_ARGUMENT
    assert {item.state for item in settled} == {OutboxState.SENT}
    for item in settled:
        assert "had already been sent again (attempt 2)" in (item.last_error or "")
        assert "received this SOP Instance UID twice" in (item.last_error or "")
    assert f"0 re-send(s) cancelled, {len(results)} already sent again" in caplog.text
    assert "radserve never asked for it" in caplog.text


def test_an_operator_retries_a_committing_row_stored_again_under_a_new_transaction(
    tmp_path: Path, results: list[Path]
) -> None:
    settings = settings_for(tmp_path)
    store, _trail = open_audited(settings)
    ops = OutboxOps(settings, store)
    url = f"sqlite:///{settings.data_dir / 'radserve.db'}"
    try:
        with _reported_by_hand(tmp_path, url, timeout_s=60.0) as (orthanc, outbox, rows, port):
            outbox.enqueue(results, now=utc_now())
            outbox.deliver_pending(utc_now())
            first = rows.items()
            [transaction] = {item.commitment_uid for item in first}
            target = first[0]
            retried = ops.retry(target.id, actor_key_id=None, client="cli")
            assert retried.state is OutboxState.PENDING and retried.attempts == 1
            assert f"transaction {transaction}) was awaited" in (retried.last_error or "")
            assert outbox.deliver_pending(utc_now()).claimed == 1  # stored again at once
            again = rows.get(target.id)
            assert again.state is OutboxState.COMMITTING and again.attempts == 2
            assert again.commitment_uid not in (None, transaction)
            others = [item for item in first if item.id != target.id]
            assert {rows.get(item.id).commitment_uid for item in others} == {transaction}
            assert _report(port, "ORTHANC", again.commitment_uid or "", [again]) == 0
            assert _report(port, "ORTHANC", transaction, first) == 0
            settled = rows.items()
            stored = len(orthanc.get("/instances"))
        audit = [r for r in store.iter_audit() if r.action == "outbox.retried"]
    finally:
        store.close()
    assert {item.state for item in settled} == {OutboxState.SENT}
    assert stored == len(results)
    [record] = audit
    assert record.subject == str(target.id) and record.payload["previous_state"] == "committing"
    assert record.payload["commitment_uid"] == transaction
    with pytest.raises(OutboxNotRetryableError):
        OutboxStore(init_store(url).engine).retry(target.id, now=utc_now())


def test_with_several_receiving_processes_the_outbox_s_process_settles_the_reports(
    tmp_path: Path, results: list[Path], database_url: str
) -> None:
    # Orthanc's report reaches a receiving process, which hands it to this process's
    # outbox and answers Orthanc with its answer
    with committing_pacs(tmp_path, receivers=2, database_url=database_url) as (
        orthanc,
        outbox,
        rows,
        scp,
    ):
        assert len(scp.receiver_pids()) == 2
        outbox.enqueue(results, now=utc_now())
        assert outbox.deliver_pending(utc_now()).claimed == len(results)
        until(
            lambda: all(item.state is OutboxState.SENT for item in rows.items()),
            "Orthanc's report, taken by a receiving process, settles every row",
        )
        [transaction] = {item.commitment_uid for item in rows.items()}
        port = scp.address[1]
        # answered as the outbox's process answers: a known transaction again, a stranger
        assert _report(port, "ORTHANC", transaction or "", rows.items()) == Status.SUCCESS
        assert _report(port, "ORTHANC", "2.25.4242", rows.items()) == Status.INVALID_ARGUMENT
        stored = len(orthanc.get("/instances"))
        attempts = {item.attempts for item in rows.items()}
    assert stored == len(results)
    assert attempts == {1}
