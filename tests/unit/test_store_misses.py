"""Deadline misses and the risk events that announced them, read from the store (jobs and
their audit records) on SQLite and PostgreSQL: the same figure from a second store on the
same database (a restarted server, another replica)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.postgres import store_on

from radserve.audit import AuditEvent
from radserve.audit.events import Action
from radserve.store import JobState, PriorityClass, Store, init_store
from radserve.store.records import utc_now

RAISED, CLEARED = Action.JOB_DEADLINE_RISK.value, Action.JOB_DEADLINE_RISK_CLEARED.value


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_misses") as opened:
        yield opened


def _job(store: Store, job_id: str, arrival: dt.datetime, deadline: dt.datetime) -> None:
    store.create_job(
        job_id=job_id,
        priority_class=PriorityClass.INPATIENT,
        arrival=arrival,
        deadline=deadline,
        pipeline_name="ct",
        pipeline_version="1",
        precision="fp32",
        fingerprint="a" * 64,
        study_path="/studies/x",
    )


def _events(store: Store, job_id: str, *actions: str) -> None:
    for action in actions:
        store.append_audit(AuditEvent(action=action, subject=job_id, payload={}))


def test_misses_and_the_risk_events_standing_at_their_deadlines(store: Store) -> None:
    t = utc_now()
    hour, window_start = dt.timedelta(hours=1), t - dt.timedelta(days=1)
    for job in ("announced", "cleared", "raised_again", "unannounced", "on_time"):
        _job(store, job, t, t + hour)  # deadlines an hour ahead: events come before them
    for job in ("late_alert", "cancelled_late"):
        _job(store, job, t - dt.timedelta(seconds=20), t - dt.timedelta(seconds=10))
    _job(store, "before_window", t - dt.timedelta(days=2), t - dt.timedelta(days=2) + hour)
    _events(store, "announced", RAISED)
    _events(store, "cleared", RAISED, CLEARED)
    _events(store, "raised_again", RAISED, CLEARED, RAISED)
    _events(store, "late_alert", RAISED)  # after its deadline: not a prediction
    store.transition("on_time", JobState.FAILED)  # ended before its deadline
    store.transition("cancelled_late", JobState.CANCELLED)  # cancelled: never a miss
    later = t + 2 * hour  # every deadline above has passed

    misses = store.deadline_misses(since=window_start, now=later)

    assert {m.job_id for m in misses} == {
        "announced", "cleared", "raised_again", "unannounced", "late_alert",
    }  # fmt: skip
    predicted = {m.job_id: m.lead_s for m in misses if m.lead_s is not None}
    assert set(predicted) == {"announced", "raised_again"}
    assert all(3000 < lead <= 3600 for lead in predicted.values())  # raised ~now, due in 1 h
    assert all(m.priority_class is PriorityClass.INPATIENT for m in misses)
    assert store.deadline_misses(since=window_start, now=t) == [
        m for m in misses if m.job_id == "late_alert"
    ]  # as of now, only its deadline has passed

    again = init_store(store.engine.url.render_as_string(hide_password=False))
    try:  # a restarted server, another replica: the same figure
        assert again.deadline_misses(since=window_start, now=later) == misses
    finally:
        again.close()


def test_false_alerts_are_jobs_alerted_that_ended_by_their_deadline(store: Store) -> None:
    t = utc_now()
    hour, window_start = dt.timedelta(hours=1), t - dt.timedelta(days=1)
    for job in ("alerted_on_time", "cleared_on_time", "quiet_on_time", "cancelled", "running"):
        _job(store, job, t, t + hour)
    _job(store, "alerted_late", t - dt.timedelta(seconds=20), t - dt.timedelta(seconds=10))
    _job(store, "before_window", t - dt.timedelta(days=2), t - dt.timedelta(days=2) + hour)
    for job in ("alerted_on_time", "alerted_late", "cancelled", "running", "before_window"):
        _events(store, job, RAISED)
    _events(store, "cleared_on_time", RAISED, CLEARED)  # raised once: still an alert
    ended = ("alerted_on_time", "cleared_on_time", "quiet_on_time", "alerted_late", "before_window")
    for job in ended:  # now: before the hour-ahead deadlines, after the others (ended as
        store.transition(job, JobState.FAILED)  # the misses count a failed job: by its end)
    store.transition("cancelled", JobState.CANCELLED)
    later = t + 2 * hour

    assert store.false_alerts(since=window_start, now=later) == 2
    assert store.false_alerts(since=window_start - dt.timedelta(days=2), now=later) == 2
    # the before-window job ended after its deadline two days ago: a miss, not false
    assert store.false_alerts(since=window_start, now=t - hour) == 0  # none ended by then
    misses = store.deadline_misses(since=window_start, now=later)
    assert {m.job_id for m in misses} == {"alerted_late", "running"}  # neither is false
