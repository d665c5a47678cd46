"""The server's deadline-risk effects when a risk is raised, cleared and raised again:
audit records, metrics, the ops view's standing risks, and syslog alerts received by a
real collector on loopback (TLS, radserve's own test collector); a collector that is
down and comes back still gets the alert, and the scheduler's thread never waits."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from tests.factories.scheduling_fakes import FakeSession, fake_work
from tests.factories.syslog import Collector, make_certificate
from tests.factories.turnaround import standalone_turnaround
from tests.factories.waits import until

from radserve.config import ConfigError, load_settings
from radserve.domain.priority import PriorityClass
from radserve.scheduling import JobRequest
from radserve.scheduling.clock import FakeClock
from radserve.service.turnaround import RISK_MSGID, Turnaround
from radserve.turnaround.eta import Eta

OUT = PriorityClass.OUTPATIENT
FACILITY, WARNING, NOTICE = 16, 4, 5


def _turnaround(
    tmp_path: Path, clock: FakeClock, policy: str = "none", **syslog: object
) -> tuple[Turnaround, CollectorRegistry]:
    return standalone_turnaround(
        tmp_path,
        clock,
        turnaround__risk_margin_s=30.0,
        turnaround__risk_clear_s=15.0,
        turnaround__risk_policy=policy,
        **{f"turnaround__risk_syslog__{k}": v for k, v in syslog.items()},
    )


def _walk(turnaround: Turnaround, finish: float, deadline: float = 1500.0) -> None:
    """One recomputation's result for job "j" (the risk decision on a given ETA)."""
    now = turnaround.scheduler.clock.now()
    eta = Eta("j", 3, now, finish, finish + 20.0, deadline)
    turnaround._check_risk([eta], {"j": OUT}, now)


def _wait_messages(collector: Collector, count: int) -> list[dict[str, object]]:
    """The collector's messages once it has ``count`` (its thread receives them)."""
    until(
        lambda: len(collector.messages) >= count,
        f"{count} risk message(s) at the collector",
        15,
        state=lambda: len(collector.messages),
    )
    return collector.parsed()


def _sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"cls": "OUTPATIENT"})


def test_raised_cleared_raised_again_audited_counted_and_sent_to_syslog(
    tmp_path: Path,
) -> None:
    try:
        cert, key = make_certificate(tmp_path)
    except (OSError, subprocess.SubprocessError) as exc:  # openssl is in the image
        pytest.skip(f"no openssl to make a certificate: {exc}")
    collector = Collector(cert=cert, key=key)
    clock = FakeClock(1000.0)
    turnaround, registry = _turnaround(
        tmp_path, clock, host="127.0.0.1", port=collector.port, tls__ca=str(cert)
    )
    turnaround.start()
    try:
        _walk(turnaround, finish=1480.0)  # past 1500 - 30: at risk
        assert [r.job_id for r in turnaround.at_risk()] == ["j"]
        clock.advance(10.0)
        _walk(turnaround, finish=1460.0)  # recovered, but inside the 15 s band: stands
        assert [r.job_id for r in turnaround.at_risk()] == ["j"]
        clock.advance(10.0)
        _walk(turnaround, finish=1450.0)  # 1500 - 30 - 15 = 1455 or earlier: cleared
        assert turnaround.at_risk() == []
        clock.advance(10.0)
        _walk(turnaround, finish=1490.0)  # late again: a second event
        assert [r.job_id for r in turnaround.at_risk()] == ["j"]
        assert turnaround.risk_counts() == {"raised": 2, "cleared": 1}

        assert _sample(registry, "radserve_deadline_risk_total") == 2.0
        assert _sample(registry, "radserve_deadline_risk_cleared_total") == 1.0
        assert _sample(registry, "radserve_jobs_at_deadline_risk") == 1.0

        actions = [
            (r.action, r.subject)
            for r in turnaround.store.iter_audit()
            if r.action.startswith("job.deadline_risk")
        ]
        assert actions == [
            ("job.deadline_risk", "j"),
            ("job.deadline_risk_cleared", "j"),
            ("job.deadline_risk", "j"),
        ]
        cleared = next(
            r for r in turnaround.store.iter_audit() if r.action == "job.deadline_risk_cleared"
        )
        assert cleared.payload["at_risk_s"] == 20.0
        assert cleared.payload["predicted_early_by_s"] == 50.0

        messages = _wait_messages(collector, 3)
        assert [m["msgid"] for m in messages] == [RISK_MSGID] * 3
        events = [m["sd"]["event"] for m in messages]  # type: ignore[index]
        assert events == ["job.deadline_risk", "job.deadline_risk_cleared", "job.deadline_risk"]
        assert [m["pri"] for m in messages] == [
            FACILITY * 8 + WARNING,
            FACILITY * 8 + NOTICE,
            FACILITY * 8 + WARNING,
        ]
        for m in messages:
            sd = m["sd"]
            assert isinstance(sd, dict) and (sd["job"], sd["cls"]) == ("j", "OUTPATIENT")
        body = json.loads(messages[0]["body"])  # type: ignore[arg-type]
        # job id, class and times only: nothing that names a patient
        assert set(body) == {
            "event", "job_id", "priority_class", "deadline", "predicted_finish",
            "predicted_finish_late", "predicted_late_by_s", "margin_s", "policy", "promoted",
            "reserved",
        }  # fmt: skip
        assert body["predicted_late_by_s"] == -20.0
    finally:
        turnaround.stop()
        collector.close()
        turnaround.store.close()


def test_a_collector_down_at_the_alert_gets_it_when_back(tmp_path: Path) -> None:
    down = Collector()
    port = down.port
    down.close()  # nothing listens: the first attempt is refused, then retried
    clock = FakeClock(1000.0)
    turnaround, _ = _turnaround(tmp_path, clock, host="127.0.0.1", port=port, transport="tcp")
    turnaround.start()
    collector: Collector | None = None
    try:
        _walk(turnaround, finish=1490.0)  # queued for the alert thread: returns at once
        assert [r.action for r in turnaround.store.iter_audit()][-1] == "job.deadline_risk"
        collector = Collector(port)
        messages = _wait_messages(collector, 1)
        assert [m["sd"]["event"] for m in messages] == ["job.deadline_risk"]  # type: ignore[index]
    finally:
        turnaround.stop()
        if collector is not None:
            collector.close()
        turnaround.store.close()


def test_risk_syslog_settings_are_checked(tmp_path: Path) -> None:
    def syslog(**values: object) -> object:
        keys = {f"turnaround__risk_syslog__{k}": v for k, v in values.items()}
        return load_settings(None, data_dir=tmp_path, **keys).turnaround.risk_syslog

    tls = syslog(host="collector")
    tcp = syslog(host="collector", transport="tcp")
    assert (tls.syslog_port, tcp.syslog_port) == (6514, 514)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="tls settings need transport tls"):
        syslog(host="collector", transport="tcp", tls__ca=str(tmp_path / "ca.pem"))
    with pytest.raises(ConfigError, match="host"):
        syslog(port=514)


def test_policy_reserve_holds_the_next_routine_slot_for_the_job_at_risk(tmp_path: Path) -> None:
    turnaround, _ = _turnaround(tmp_path, FakeClock(1000.0), policy="reserve")
    scheduler = turnaround.scheduler
    session = FakeSession()
    for job_id in ("running", "j"):
        scheduler.submit(JobRequest(job_id, fake_work(session, 1), OUT))
    try:
        assert scheduler.next_cpu_dispatch() is not None  # "running" takes the one slot
        _walk(turnaround, finish=1490.0)
        record = [r for r in turnaround.store.iter_audit() if r.action == "job.deadline_risk"]
        assert [(r.subject, r.payload["policy"]) for r in record] == [("j", "reserve")]
        assert record[0].payload["reserved"] and record[0].payload["promoted"]
        assert list(scheduler._book.reserved) == ["j"]
    finally:
        turnaround.store.close()


def test_a_reprioritised_jobs_cleared_alert_names_its_current_class_and_deadline(
    tmp_path: Path,
) -> None:
    """Through the server's turnaround: the audit record and the JSON POST to a real
    loopback webhook. Raised as INPATIENT, re-prioritised to OUTPATIENT (a later
    deadline): the cleared event said INPATIENT and the INPATIENT deadline before."""
    from tests.factories.fhir_server import FhirServer

    clock = FakeClock(1000.0)
    with FhirServer() as hook:
        turnaround, _ = standalone_turnaround(
            tmp_path,
            clock,
            turnaround__risk_margin_s=30.0,
            turnaround__risk_clear_s=15.0,
            turnaround__risk_webhook_url=hook.url,
        )
        turnaround.start()
        try:
            now = clock.now()
            inpatient = Eta("j", 0, now, now + 40.0, now + 60.0, now + 50.0)
            turnaround._check_risk([inpatient], {"j": PriorityClass.INPATIENT}, now)
            clock.advance(5.0)
            now = clock.now()
            outpatient = Eta("j", 1, now, now + 40.0, now + 60.0, now + 1800.0)
            turnaround._check_risk([outpatient], {"j": OUT}, now)
            until(lambda: len(hook.received) >= 2, "two risk alerts at the webhook", 15)
            records = {
                r.action: r.payload
                for r in turnaround.store.iter_audit()
                if r.action.startswith("job.deadline_risk")
            }
        finally:
            turnaround.stop()
            turnaround.store.close()
    alerts = {a["event"]: a for a in (r.json() for r in hook.received)}
    for events in (records, alerts):
        raised, cleared = events["job.deadline_risk"], events["job.deadline_risk_cleared"]
        assert raised["priority_class"] == "INPATIENT"
        assert cleared["priority_class"] == "OUTPATIENT"
        assert cleared["deadline"] != raised["deadline"]
        assert cleared["deadline"] > raised["deadline"]
        assert cleared["predicted_early_by_s"] == 1800.0 - 40.0
