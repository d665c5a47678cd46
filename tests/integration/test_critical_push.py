"""Critical findings pushed to a real loopback webhook through the durable outbox: a real
run of the test pipeline on a phantom whose lesion exceeds the declared size is pushed;
the receiver is down first (refused, retried with back-off, never given up), then up (its
2xx is the acknowledgement: sent once, never again). The result -> push latency of the
run is measured and printed, not asserted."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc
from tests.factories.dicom_net import free_port
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.results import lesion_study
from tests.factories.syslog import Collector
from tests.factories.waits import until, wait_until

from radserve.audit.syslog import SyslogEndpoint
from radserve.config import load_settings
from radserve.critical.push import AnyReceiver, CriticalOutbox, Receiver, build_notice
from radserve.critical.receivers import FhirReceiver, SyslogReceiver
from radserve.domain.critical import CriticalRule, critical_findings
from radserve.errors import ReportError
from radserve.fhir.delivery import FhirDestination
from radserve.gateway.outbox import Lane, OutboxWorker, utc_now
from radserve.gateway.scu import Outcome
from radserve.ingest import PatientInfo
from radserve.pipeline.spec import PipelineSpec
from radserve.report.fhir import build_fhir_bundle
from radserve.report.fhir.bundle import ReportResources
from radserve.report.fhir.critical import critical_bundle
from radserve.service.critical import CriticalDelivery
from radserve.service.metrics import Metrics
from radserve.store import Store, init_store
from radserve.store.errors import DatabaseUnavailableError
from radserve.store.outbox import OutboxItem, OutboxKind, OutboxState, OutboxStore

_NOTICE_KINDS = ("Communication", "Flag")
_REPORT = "DiagnosticReport"


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[OutboxStore]:
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield OutboxStore(store.engine)
    store.close()


def test_rules_are_validated_in_the_pipeline_shape() -> None:
    spec = {"name": "p", "version": "1", "steps": [{"model": "m"}]}
    ok = PipelineSpec.model_validate(
        {**spec, "critical": [{"label": "liver_lesion", "min_long_axis_mm": 20}]}
    )
    assert ok.critical[0].min_long_axis_mm == 20
    for bad in ({"label": ""}, {"label": "x", "min_long_axis_mm": -1}, {"label": "x", "size": 3}):
        with pytest.raises(ValidationError):
            PipelineSpec.model_validate({**spec, "critical": [bad]})


def test_a_phantom_lesion_over_the_threshold_is_pushed_until_acknowledged(
    rows: OutboxStore, tmp_path: Path
) -> None:
    study = lesion_study(tmp_path / "run")
    result_at = utc_now()  # the result exists
    findings = study.report.findings
    assert findings, "the phantom's lesions were found"
    sizes = sorted(f.longest_diameter_mm for f in findings)
    # a threshold between the two lesions: only the larger one is critical
    threshold = (sizes[0] + sizes[-1]) / 2
    rules = [CriticalRule(label=findings[0].label, min_long_axis_mm=threshold)]
    hits = critical_findings(rules, findings)
    assert [f.longest_diameter_mm for _, f in hits] == [
        f.longest_diameter_mm for f in findings if f.longest_diameter_mm >= threshold
    ]
    assert 0 < len(hits) < len(findings)

    server = FhirServer()
    try:
        box = CriticalOutbox(rows, [Receiver("ward", server.url, bearer_token="t-1")])
        t0 = time.perf_counter()
        uid = study.report.study.study_instance_uid or ""
        for rule, finding in hits:
            notice = build_notice("job-1", uid, rule, finding, result_at)
            box.enqueue(notice, folder=tmp_path / "out", job_id="job-1")
        # receiver down: refused, retried with back-off
        down = box.deliver_pending()
        assert (down.claimed, down.retried, down.sent) == (len(hits), len(hits), 0)
        pending = rows.items(kind=OutboxKind.CRITICAL)
        assert {r.state for r in pending} == {OutboxState.PENDING}
        assert all("cannot reach the receiver" in (r.last_error or "") for r in pending)
        # never given up, however old: a critical finding waits for its receiver
        a_month = utc_now() + dt.timedelta(days=30)
        server.up()
        up = box.deliver_pending(a_month)
        assert (up.claimed, up.sent) == (len(hits), len(hits))
        received = [r.json() for r in server.received]
        assert [n["finding"]["finding_id"] for n in received] == [f.finding_id for _, f in hits]
        assert all(r.headers["Authorization"] == "Bearer t-1" for r in server.received)
        assert all(n["result_at"] == result_at.isoformat() for n in received)
        assert "Doe" not in str(received)  # no patient name in a notice
        # acknowledged rows are never posted again, and re-queueing adds nothing
        for rule, finding in hits:
            box.enqueue(build_notice("job-1", uid, rule, finding, result_at), folder=tmp_path)
        assert box.deliver_pending(a_month + dt.timedelta(hours=1)).claimed == 0
        assert len(server.received) == len(hits)
        assert {r.state for r in rows.items(kind=OutboxKind.CRITICAL)} == {OutboxState.SENT}

        # measured once (not asserted): result -> push with the receiver up from the start
        box2 = CriticalOutbox(rows, [Receiver("desk", server.url)])
        start = utc_now()
        t1 = time.perf_counter()
        rule, finding = hits[0]
        box2.enqueue(build_notice("job-2", uid, rule, finding, start), folder=tmp_path / "o2")
        assert box2.deliver_pending().sent == 1
        latency_ms = (time.perf_counter() - t1) * 1000
        whole = time.perf_counter() - t0
        print(f"\ncritical push: result -> acknowledged push {latency_ms:.1f} ms (enqueue")
        print(f"with fsync + commit + POST); the whole down/up test {whole:.2f} s")
    finally:
        server.down()


def test_a_syslog_collector_restarted_between_two_notices_gets_both(
    rows: OutboxStore, tmp_path: Path
) -> None:
    """Plain TCP (RFC 6587 octet counting). The collector closes the kept connection when
    it restarts; a write on it would "succeed" into the kernel's buffer and be lost, so
    the client notices the close and opens a new connection for the second notice."""
    study = lesion_study(tmp_path / "run")
    finding = study.report.findings[0]
    rule = CriticalRule(label=finding.label)
    port = free_port()
    receiver = SyslogReceiver("siem", SyslogEndpoint("127.0.0.1", port, tls=None))
    box = CriticalOutbox(rows, [receiver])
    collector = Collector(port)
    try:
        box.enqueue(build_notice("job-1", "1.2.3", rule, finding, utc_now()), folder=tmp_path)
        assert box.deliver_pending().sent == 1
        assert wait_until(lambda: len(collector.parsed()) == 1, timeout=10)
        collector.close()  # restarted: the kept connection is closed under the client
        collector = Collector(port)
        box.enqueue(build_notice("job-2", "1.2.3", rule, finding, utc_now()), folder=tmp_path)
        report = box.deliver_pending()
        assert (report.sent, report.retried) == (1, 0)
        assert wait_until(lambda: len(collector.parsed()) == 1, timeout=10)
        (message,) = collector.parsed()
        assert message["msgid"] == "RADSERVE-CRITICAL"
        assert json.loads(message["body"])["job_id"] == "job-2"  # type: ignore[arg-type]
        assert collector.connections == 1
        row = next(r for r in rows.items(kind=OutboxKind.CRITICAL) if r.job_id is None)
        assert row.state == OutboxState.SENT
    finally:
        box.close()
        collector.close()


def test_fhir_receivers_get_a_communication_and_only_those_that_ask_a_flag(
    rows: OutboxStore, tmp_path: Path
) -> None:
    study = lesion_study(tmp_path / "run")
    finding = study.report.findings[0]
    rule = CriticalRule(label=finding.label)
    patient = PatientInfo(patient_name="Doe^Jane", patient_id="P-1")
    job_bundle = build_fhir_bundle(study.report, patient)
    resources = ReportResources(study.report, patient)
    notice = build_notice("job-1", "1.2.3", rule, finding, utc_now())
    fhir = critical_bundle(
        resources, finding_id=finding.finding_id, notice_id=notice["id"],
        rule=rule.describe(), sent=utc_now(), flag=True,
    )  # fmt: skip
    # built without the job's Bundle, by its definition: every resource the push carries
    # is the one the job's Bundle, sent later, holds (same id, same conditional create),
    # and the push carries exactly what its Communication references, no other finding
    in_job = {e["fullUrl"]: e for e in job_bundle["entry"]}
    carried = [e for e in fhir["entry"] if e["resource"]["resourceType"] not in _NOTICE_KINDS]
    assert all(e == in_job[e["fullUrl"]] for e in carried)
    group = next(e for e in carried if "hasMember" in e["resource"])
    assert sorted(e["resource"]["resourceType"] for e in carried) == sorted(
        ["Patient", "Device", "ImagingStudy", "Observation"]
        + ["Observation"] * len(group["resource"]["hasMember"])
    )
    (communication,) = [
        e["resource"] for e in fhir["entry"] if e["resource"]["resourceType"] == "Communication"
    ]
    assert {"reference": group["fullUrl"]} in communication["about"]
    # the DiagnosticReport (not carried: it would be created without its other results)
    # is referenced by the identifier the job's Bundle gives it
    (report,) = [e for e in job_bundle["entry"] if e["resource"]["resourceType"] == _REPORT]
    assert {"type": _REPORT, "identifier": report["resource"]["identifier"][0]} in communication[
        "about"
    ]
    with FhirServer() as server:
        box = CriticalOutbox(
            rows,
            [
                FhirReceiver("ehr", FhirDestination(server.url, "ehr"), flag=True),
                FhirReceiver("ris", FhirDestination(server.url, "ris")),
                Receiver("ward", server.url),
            ],
        )
        box.enqueue(notice, folder=tmp_path, job_id="job-1", fhir_bundle=fhir)
        assert box.deliver_pending().sent == 3
        box.close()
    by_kind = {
        tuple(sorted({e["resource"]["resourceType"] for e in r.json()["entry"]}))
        if "entry" in r.json() else "notice": r
        for r in server.received
    }  # fmt: skip
    bundles = [kinds for kinds in by_kind if kinds != "notice"]
    assert len(bundles) == 2
    with_flag, without = sorted(bundles, key=lambda kinds: "Flag" in kinds, reverse=True)
    assert "Flag" in with_flag and "Flag" not in without
    assert "Communication" in with_flag and "Communication" in without
    # the FHIR push names the patient (a clinical receiver); the webhook notice never does
    assert "Doe" in by_kind[with_flag].body.decode()
    assert "Doe" not in by_kind["notice"].body.decode()
    # a notice whose report has no such finding cannot become a Communication
    with pytest.raises(ReportError, match="needs finding 99 in its report"):
        critical_bundle(resources, finding_id=99, notice_id="x", rule="r", sent=utc_now())


def test_each_receiver_has_its_own_sender_a_slow_one_delays_no_other(
    rows: OutboxStore, tmp_path: Path
) -> None:
    """The slow receiver's row is claimed first (queued first) and takes seconds to be
    answered; the other receiver's notice is acknowledged meanwhile. One sender for all
    receivers would post it only after the slow answer: the order is what is checked."""
    study = lesion_study(tmp_path / "run")
    finding = study.report.findings[0]
    notice = build_notice("job-1", "1.2.3", CriticalRule(label=finding.label), finding, utc_now())
    with FhirServer() as slow, FhirServer() as fast:
        slow.script(Answer(delay_s=5.0))
        box = CriticalOutbox(rows, [Receiver("slow", slow.url), Receiver("fast", fast.url)])
        box.enqueue(notice, folder=tmp_path, job_id="job-1")
        workers = [
            OutboxWorker(Lane(box, destination), name=f"lane-{destination}")
            for destination in box.receivers
        ]

        def state(name: str) -> OutboxState:
            (row,) = rows.items(destination=f"critical:{name}", kind=OutboxKind.CRITICAL)
            return row.state

        try:
            for worker in workers:
                worker.start()
            assert wait_until(lambda: state("fast") == OutboxState.SENT, timeout=30)
            # not answered yet (the lanes start together: its POST may still be on its way)
            assert state("slow") in (OutboxState.PENDING, OutboxState.SENDING)
            until(lambda: len(slow.received) == 1, "the slow receiver's POST", 30)
            assert wait_until(lambda: state("slow") == OutboxState.SENT, timeout=30)
        finally:
            for worker in workers:
                worker.stop()
            box.close()
        assert len(slow.received) == 1 and len(fast.received) == 1  # exactly once each


def test_notices_for_a_receiver_no_longer_configured_are_failed_not_left_pending(
    tmp_path: Path,
) -> None:
    """A receiver removed from the config between a notice's queueing and its push (a
    restart with the new config): the server's critical delivery fails its row with the
    reason and sends the kept receiver's. With a sender per configured receiver only, the
    row stayed pending for good."""
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    rows = OutboxStore(store.engine)
    study = lesion_study(tmp_path / "run")
    finding = study.report.findings[0]
    notice = build_notice("job-1", "1.2.3", CriticalRule(label=finding.label), finding, utc_now())
    with FhirServer() as kept, FhirServer() as gone:
        before = CriticalOutbox(rows, [Receiver("kept", kept.url), Receiver("gone", gone.url)])
        before.enqueue(notice, folder=tmp_path, job_id="job-1")
        before.close()
        settings = load_settings(
            None,
            data_dir=tmp_path / "data",
            critical__receivers=[{"name": "kept", "url": kept.url}],
        )
        delivery = CriticalDelivery(
            settings, store=store, metrics=Metrics(lambda: None), rules_for=lambda _job: ()
        )

        def row(name: str) -> OutboxItem:
            (item,) = rows.items(destination=f"critical:{name}", kind=OutboxKind.CRITICAL)
            return item

        try:
            delivery.start()
            until(lambda: row("gone").state == OutboxState.FAILED_PERMANENT, "the row failed", 30)
            until(lambda: row("kept").state == OutboxState.SENT, "the kept notice sent", 30)
        finally:
            delivery.stop()
            store.close()
        assert "no longer configured" in (row("gone").last_error or "")
        assert gone.received == [] and len(kept.received) == 1


def _study_notices(n: int) -> list[tuple[dict[str, object], None]]:
    """``n`` notices of one study (what a study with ``n`` critical findings queues)."""
    return [
        ({"id": f"notice-{i:02d}", "job_id": "job-1", "study_instance_uid": "1.2.3",
          "finding": {"finding_id": i, "label": "liver_lesion"}}, None)
        for i in range(n)
    ]  # fmt: skip


@contextmanager
def _commits_held_while_arriving(
    engine: Engine, arrived: Callable[[], int], n: int
) -> Iterator[list[int]]:
    """Every commit on ``engine`` made after the receiver's first notice waits until it has
    all ``n`` (at most 10 s: the list it yields then gets how many it had, and no later
    commit waits). A slow disk or another writer holding SQLite's lock makes commits slow;
    here they wait for as long as the test says, deterministically."""
    ran_out: list[int] = []

    def holding() -> bool:
        return 0 < arrived() < n

    def hold(_connection: object) -> None:
        if not ran_out and holding() and not wait_until(lambda: not holding(), timeout=10):
            ran_out.append(arrived())

    event.listen(engine, "commit", hold)
    try:
        yield ran_out
    finally:
        event.remove(engine, "commit", hold)


@pytest.mark.parametrize("kind", ["webhook", "syslog"])
def test_a_studys_notices_go_out_back_to_back_without_waiting_for_each_commit(
    rows: OutboxStore, tmp_path: Path, kind: str
) -> None:
    """20 notices of one study: the database's commits are held from the receiver's first
    notice until it has all 20. The receiver gets all 20 meanwhile, over one kept
    connection, and each row is then recorded ``sent`` on its own with its own answer
    time and told to ``on_settled`` once. Before, each notice waited for its
    predecessor's commit: the receiver had 1 of 20 when the hold ran out."""
    n = 20
    settled: list[tuple[str, Outcome]] = []
    with contextlib.ExitStack() as stack:
        if kind == "webhook":
            server = stack.enter_context(FhirServer(keep_alive=True))
            receiver: AnyReceiver = Receiver("ward", server.url)

            def arrived() -> int:
                return len(server.received)

            def connections() -> int:
                return server.connections
        else:
            collector = Collector(0)
            stack.callback(collector.close)
            receiver = SyslogReceiver("siem", SyslogEndpoint("127.0.0.1", collector.port, tls=None))

            def arrived() -> int:
                return len(collector.parsed())

            def connections() -> int:
                return collector.connections

        def tell(item: OutboxItem, outcome: Outcome, _result: object, _at: object) -> None:
            settled.append((item.sop_instance_uid, outcome))

        box = CriticalOutbox(rows, [receiver], on_settled=tell)
        stack.callback(box.close)
        box.enqueue_all(_study_notices(n), folder=tmp_path, job_id="job-1")
        with _commits_held_while_arriving(rows.engine, arrived, n) as ran_out:
            report = box.deliver_pending()
        assert not ran_out, f"the receiver had {ran_out} of {n} notices when the hold ran out"
        assert (report.claimed, report.sent) == (n, n)
        assert arrived() == n and connections() == 1
    items = sorted(rows.items(kind=OutboxKind.CRITICAL), key=lambda r: r.sop_instance_uid)
    assert [r.state for r in items] == [OutboxState.SENT] * n
    sent_at = [r.sent_at for r in items]
    assert sent_at == sorted(sent_at)  # each its own answer time, in the order sent
    assert sorted(settled) == [(f"notice-{i:02d}", Outcome.SENT) for i in range(n)]


def test_a_failed_commit_stops_the_sends_and_loses_no_notice(
    rows: OutboxStore, tmp_path: Path
) -> None:
    """The database goes away while a study's notices are being sent: the first commit of
    an answer fails, the sender stops and says so (its worker retries later); the rows
    not recorded keep their lease, and once it has run out every notice is sent and
    recorded."""
    n = 5
    with FhirServer(keep_alive=True) as server:
        box = CriticalOutbox(rows, [Receiver("ward", server.url)])
        box.enqueue_all(_study_notices(n), folder=tmp_path, job_id="job-1")
        failures = [sa_exc.OperationalError("COMMIT", {}, Exception("disk I/O error"))]

        def fail_once(_connection: object) -> None:
            if server.received and failures:
                raise failures.pop()

        event.listen(rows.engine, "commit", fail_once)
        try:
            with pytest.raises(DatabaseUnavailableError, match="database unavailable"):
                box.deliver_pending()
        finally:
            event.remove(rows.engine, "commit", fail_once)
        states = [r.state for r in rows.items(kind=OutboxKind.CRITICAL)]
        assert OutboxState.SENDING in states and OutboxState.PENDING not in states
        later = utc_now() + box.lease + dt.timedelta(seconds=1)  # their lease ran out
        assert box.deliver_pending(later).sent == states.count(OutboxState.SENDING)
        box.close()
    items = rows.items(kind=OutboxKind.CRITICAL)
    assert {r.state for r in items} == {OutboxState.SENT}
    assert {r.json()["id"] for r in server.received} == {f"notice-{i:02d}" for i in range(n)}


def test_a_notice_carries_the_reports_caveats_to_every_receiver(
    rows: OutboxStore, tmp_path: Path
) -> None:
    """Session 36's probe: a 128x128 phantom flagged outside the models' input domain
    paged 36 critical lung nodules with nothing in the notices to say so."""
    from radserve.critical.push import caveats_of
    from radserve.report.schema import ReportWarning

    study = lesion_study(tmp_path / "run")
    finding = study.report.findings[0]
    rule = CriticalRule(label=finding.label)
    warnings = [
        ReportWarning(code="outside_input_domain", message="pixel spacing 4.8 mm outside"),
        ReportWarning(code="missing_slice", message="one slice missing"),  # no caveat
        ReportWarning(code="lossy_input", message="24 of 24 images were lossy compressed"),
    ]
    caveats = caveats_of(warnings)
    assert [c["code"] for c in caveats] == ["outside_input_domain", "lossy_input"]
    server = FhirServer()
    server.up()
    try:
        box = CriticalOutbox(rows, [Receiver("ward", server.url)])
        notice = build_notice("job-9", "1.2.3", rule, finding, utc_now(), caveats)
        box.enqueue(notice, folder=tmp_path / "out", job_id="job-9")
        assert box.deliver_pending().sent == 1
        (received,) = [r.json() for r in server.received]
        assert received["caveats"] == caveats
    finally:
        server.down()
