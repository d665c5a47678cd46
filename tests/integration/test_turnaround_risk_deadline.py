"""A deadline-risk event names the job's deadline exactly as the job API does.

Probe of session 37: the event's ``deadline`` differed from ``GET /v1/jobs/{id}``'s by
10-30 ms. The API shows the job row's deadline (the stored arrival + the class's TAT,
wall clock); the event converted the scheduler's own deadline (monotonic: the scheduler's
arrival, taken when the job entered it, tens of ms after the row was written) back to
wall time at the moment of the event. Now the event reads the row's deadline: one
source of truth. Through a real server, a real loopback webhook, and the audit record."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tests.factories.fhir_server import FhirServer
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job
from tests.factories.waits import until


def _instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _raised(hook: FhirServer) -> dict[str, dict[str, object]]:
    """The webhook's risk alerts (not their clearings) by job."""
    bodies = [r.json() for r in hook.received]
    return {b["job_id"]: b for b in bodies if b["event"] == "job.deadline_risk"}


def test_the_risk_events_deadline_is_the_job_apis(tmp_path: Path) -> None:
    with FhirServer() as hook:
        settings = settings_for(
            tmp_path,
            # a prior far slower than the test models: each job is at risk at submission
            turnaround__prior_per_slice_s=5.0,
            turnaround__risk_margin_s=0.1,
            turnaround__risk_webhook_url=hook.url,
            scheduler__tat_s__outpatient=30.0,
        )
        with live_server(settings) as live:
            c, key, service = live["client"], live["submit"], live["service"]
            ids = []
            for i in range(3):
                files = make_study(tmp_path / f"s{i}")
                answer = c.post("/v1/studies", files=upload(files), headers=auth(key))
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["id"])
            jobs = {job_id: wait_job(c, job_id, key) for job_id in ids}
            audited = {
                r.subject: r.payload
                for r in service.store.iter_audit()
                if r.action == "job.deadline_risk"
            }
            # at least the first (the prior's prediction); later ones once the first
            # finished teach the model only if they are predicted late still
            assert audited and set(audited) <= set(ids), audited
            until(lambda: set(_raised(hook)) == set(audited), "a risk alert per event", 30)
    alerts = _raised(hook)
    for job_id in audited:
        job = jobs[job_id]
        deadline = _instant(job["deadline"])
        assert _instant(str(alerts[job_id]["deadline"])) == deadline, (job, alerts[job_id])
        assert _instant(audited[job_id]["deadline"]) == deadline, (job, audited[job_id])


def test_a_reprioritised_jobs_events_name_its_rows_new_deadline(tmp_path: Path) -> None:
    """Raised as INPATIENT, re-prioritised to OUTPATIENT (the scheduler first, then the
    row, as the API does), cleared: each event names the row's deadline of its time (the
    turnaround reads the row again once the class it knew changed)."""

    from radserve.config import SchedulerSettings, load_settings
    from radserve.domain.priority import PriorityClass
    from radserve.scheduling import Scheduler
    from radserve.scheduling.clock import FakeClock
    from radserve.service.metrics import Metrics
    from radserve.service.turnaround import Turnaround
    from radserve.store import init_store
    from radserve.turnaround.eta import Eta

    inpatient, outpatient = PriorityClass.INPATIENT, PriorityClass.OUTPATIENT
    clock = FakeClock(1000.0)
    scheduler = Scheduler(SchedulerSettings(max_running=1), clock=clock)
    tat = scheduler.config.tat
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    row = store.create_job(
        priority_class=inpatient, deadline=dt.timedelta(seconds=tat(inpatient)),
        pipeline_name="p", pipeline_version="1", precision="fp32", fingerprint="f",
        study_path=str(tmp_path / "no-such-study"),
    )  # fmt: skip
    with FhirServer() as hook:
        settings = load_settings(
            None, data_dir=tmp_path / "data", turnaround__risk_margin_s=30.0,
            turnaround__risk_clear_s=15.0, turnaround__risk_webhook_url=hook.url,
        )  # fmt: skip
        turnaround = Turnaround(
            settings, store=store, scheduler=scheduler,
            metrics=Metrics(scheduler.snapshot),
            lookup=store.get_job, device="cpu", cpu_workers=2,
        )  # fmt: skip
        turnaround.start()
        try:
            now = clock.now()  # the job entered the scheduler now: its deadline, scheduler clock
            deadline = now + tat(inpatient)
            late = Eta(row.id, 0, now, deadline - 10.0, deadline, deadline)
            turnaround._check_risk([late], {row.id: inpatient}, now)
            moved = store.reprioritise_job(
                row.id, outpatient, row.arrival + dt.timedelta(seconds=tat(outpatient)),
                actor_key_id=None, client_address=None, extra={},
            )  # fmt: skip
            clock.advance(5.0)
            now = clock.now()
            deadline += tat(outpatient) - tat(inpatient)
            early = Eta(row.id, 1, now, now + 40.0, now + 60.0, deadline)
            turnaround._check_risk([early], {row.id: outpatient}, now)
            until(lambda: len(hook.received) >= 2, "the two risk alerts", 15)
            records = {
                r.action: r.payload
                for r in store.iter_audit()
                if r.action.startswith("job.deadline_risk")
            }
        finally:
            turnaround.stop()
            store.close()
    alerts = {a["event"]: a for a in (r.json() for r in hook.received)}
    assert moved.deadline > row.deadline
    for events in (records, alerts):
        raised, cleared = events["job.deadline_risk"], events["job.deadline_risk_cleared"]
        assert _instant(raised["deadline"]) == row.deadline
        assert _instant(cleared["deadline"]) == moved.deadline
