"""``Retry-After`` as a peer writes it (RFC 9110 10.2.3): seconds or an HTTP date."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from radserve.http_answer import Answer

NOW = dt.datetime(2026, 12, 8, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("Tue, 08 Dec 2026 00:05:00 GMT", 300.0),
        ("Mon, 07 Dec 2026 23:00:00 GMT", 0.0),  # in the past: at once
        ("", None),
        ("-5", None),
        ("1.5", None),
        ("tomorrow", None),
        ("9" * 40, 999999999999.0),  # cut to a few digits, then to the policy's bound
    ],
)
def test_retry_after_is_read_as_seconds_or_a_date(value: str, seconds: float | None) -> None:
    answer = Answer(503, "Service Unavailable", httpx.Headers({"Retry-After": value}))
    assert answer.retry_after_s(NOW) == seconds


def test_no_retry_after_is_none() -> None:
    assert Answer(429, "Too Many Requests").retry_after_s(NOW) is None
