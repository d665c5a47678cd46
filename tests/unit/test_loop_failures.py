"""A periodic loop's failure log (radserve.loop_failures): once, then a short line per
``repeat_s`` at most, then one line when it works again; a traceback only for what is
not a radserve error (a bug), and only once."""

from __future__ import annotations

import logging

import pytest

from radserve.loop_failures import LoopFailures
from radserve.store.errors import DatabaseUnavailableError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, bool]]:
    # radserve's redaction filter (security/logs.py), once installed by any earlier test,
    # renders the traceback into exc_text and clears exc_info: either one means a traceback.
    return [(r.getMessage().split(" (")[0], bool(r.exc_info or r.exc_text)) for r in caplog.records]


def test_an_outage_is_logged_once_then_every_repeat_s_then_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    failures = LoopFailures(logging.getLogger("radserve.test"), "polling", repeat_s=60, clock=clock)
    failures.succeeded()  # nothing to say
    for _ in range(150):  # a round every second for 150 s
        failures.failed(DatabaseUnavailableError("database unavailable: connection refused"))
        clock.now += 1.0
    assert failures.failing
    failures.succeeded()
    assert not failures.failing
    assert _lines(caplog) == [
        ("polling failed", False),
        ("polling still failing after 60 s", False),
        ("polling still failing after 120 s", False),
        ("polling works again after 150.0 s", False),
    ]
    assert "store_error: database unavailable" in caplog.records[0].getMessage()


def test_a_bug_gets_its_traceback_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    failures = LoopFailures(logging.getLogger("radserve.test"), "polling", repeat_s=60, clock=clock)
    for _ in range(5):
        failures.failed(KeyError("oops"))
        clock.now += 1.0
    assert _lines(caplog) == [
        ("polling failed; trying again, logged every 60 s while it fails", True)
    ]
