"""The scheduler decides deadline misses (and the ETA walk risk) on the job row's
deadline, the one the job API shows: one definition.

Before, the scheduler counted its own deadline from when the job entered it (now + the
class's TAT), tens of ms after the row was written with its own (arrival + TAT): a miss
and a risk were decided on a deadline that far off the stored one. Scaled up here: a
row written a while before it is handed to the scheduler (the same path the server's
intake takes, held so that nothing runs) keeps the row's deadline, and one whose stored
deadline has passed is a miss at once."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from tests.factories.service import live_server, make_study, settings_for

from radserve.domain.priority import PriorityClass
from radserve.store import JobRecord

TAT_S = 60.0


def _row(service: Any, study: Path, *, written_s_ago: float) -> JobRecord:
    """A job row of an OUTPATIENT study as the intake writes it, ``written_s_ago``."""
    stored = service.intake.storage.store_study_files(make_study(study))
    resolved = service.catalog.resolve(None)
    arrival = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=written_s_ago)
    return service.store.create_job(  # type: ignore[no-any-return]
        priority_class=PriorityClass.OUTPATIENT,
        deadline=dt.timedelta(seconds=TAT_S),
        arrival=arrival,
        pipeline_name=resolved.spec.name,
        pipeline_version=resolved.spec.version,
        precision=resolved.precision,
        fingerprint=stored.fingerprint,
        study_path=str(stored.path),
    )


def test_the_scheduler_keeps_the_rows_deadline(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, scheduler__tat_s__outpatient=TAT_S)
    with live_server(settings, warm=False) as live:
        service = live["service"]
        service.scheduler.hold("test", "held by the test: nothing runs")
        resolved = service.catalog.resolve(None)
        waiting = _row(service, tmp_path / "a", written_s_ago=20.0)
        late = _row(service, tmp_path / "b", written_s_ago=TAT_S + 5.0)
        for record in (waiting, late):
            service.intake.schedule(record, resolved)
        try:
            info = service.scheduler.job_info(waiting.id)
            stored_left = (waiting.deadline - dt.datetime.now(dt.UTC)).total_seconds()
            # the row's: ~40 s left; the scheduler's own count gave the full 60 s
            assert abs(info.slack_s - stored_left) < 1.0, (info.slack_s, stored_left)
            assert not info.missed
            # its stored deadline passed 5 s ago: a miss (the scheduler gave it 60 s more)
            service.scheduler.check_deadlines()  # (the watchdog's may have come first)
            assert service.scheduler.job_info(late.id).missed
            assert service.scheduler.job_info(late.id).slack_s < 0
        finally:
            for record in (waiting, late):
                service.scheduler.cancel(record.id)
            service.scheduler.release()
