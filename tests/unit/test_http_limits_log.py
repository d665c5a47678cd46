"""Heads cut for time are logged as a count, at most a line per interval: a client with
many slow connections does not choose how many lines the server writes."""

from __future__ import annotations

import logging

import pytest

from radserve.api.http_limits import _CutLog


def test_a_burst_of_slow_heads_is_one_line_then_a_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = _CutLog(
        "request head(s) not complete after %.0f s: 408", every_s=10.0, clock=lambda: now[0]
    )
    logger = logging.getLogger("test.slow_heads")
    with caplog.at_level(logging.WARNING, logger="test.slow_heads"):
        for _ in range(300):  # one burst: the first is logged, the rest counted
            log.count(logger, 60.0)
        now[0] += 10.0
        log.count(logger, 60.0)
    assert [r.getMessage() for r in caplog.records] == [
        "1 request head(s) not complete after 60 s: 408",
        "300 request head(s) not complete after 60 s: 408",
    ]
