"""Store records built in tests without a database: every field a plain default, the test
names what it is about."""

from __future__ import annotations

import datetime as dt
from typing import Any

from radserve.domain.priority import PriorityClass
from radserve.store import JobRecord, JobState

T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def job_record(**fields: Any) -> JobRecord:
    """A succeeded OUTPATIENT job of the test pipeline that arrived at :data:`T0` with a
    one-hour deadline; ``fields`` override any of it."""
    arrival = fields.pop("arrival", T0)
    values: dict[str, Any] = {
        "id": "job-1",
        "state": JobState.SUCCEEDED,
        "priority_class": PriorityClass.OUTPATIENT,
        "arrival": arrival,
        "deadline": arrival + dt.timedelta(hours=1),
        "pipeline_name": "test-pipeline",
        "pipeline_version": "1",
        "precision": "fp32",
        "fingerprint": "f" * 64,
        "study_path": "/nowhere",
    }
    return JobRecord(**{**values, **fields})
