"""The console stream's ``waiting`` event (radserve.console.events.WaitingEvents): sent
on a stream's first round and whenever the block's reason or start changes, not for a
message whose running count of seconds moved (every Ray worker lost: "the last 12 s
ago", then "13 s ago")."""

from __future__ import annotations

import datetime as dt
import json

from radserve.console.events import WaitingEvents
from radserve.service.job_view import JobWait

SINCE = dt.datetime(2026, 12, 7, 9, 30, 5, 250_000, tzinfo=dt.UTC)


def _data(event: bytes | None) -> object:
    assert event is not None
    name, data = event.decode().strip().split("\n")
    assert name == "event: waiting"
    return json.loads(data.removeprefix("data: "))


def test_the_block_is_sent_when_it_starts_changes_and_ends() -> None:
    events = WaitingEvents()
    assert _data(events.event(None)) is None  # the first round says there is none
    assert events.event(None) is None
    lost = JobWait("no_device_worker", "no Ray worker is alive ... 12 s ago", SINCE)
    assert _data(events.event(lost)) == {
        "reason": "no_device_worker",
        "message": lost.message,
        "since": "2026-12-07T09:30:05Z",
    }
    later = JobWait("no_device_worker", "no Ray worker is alive ... 13 s ago", SINCE)
    assert events.event(later) is None
    held = JobWait("schema_not_current", "the database schema changed", SINCE)
    assert _data(events.event(held))["reason"] == "schema_not_current"  # type: ignore[index]
    assert _data(events.event(None)) is None
