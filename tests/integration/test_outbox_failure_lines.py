"""A receiver that keeps failing is logged once a minute, not once an attempt.

Before, every failed attempt was a warning line: a down critical receiver retried every
0.1 s (or 5e-324 s, when that was taken) wrote a line per notice per round. Every
attempt is still recorded on its row; only the log lines are summarised."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.fhir_server import FhirServer

from radserve.critical.push import CriticalOutbox, Receiver
from radserve.gateway import outbox as gateway_outbox
from radserve.gateway.outbox import RetryPolicy, utc_now
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxKind, OutboxStore

ROUNDS = 12
NOTICES = 3


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield opened
    opened.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failure_lines(caplog: pytest.LogCaptureFixture, destination: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and destination in r.getMessage()
    ]


def test_a_down_receiver_is_logged_once_a_minute_then_once_when_back(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_now = [0.0]
    monkeypatch.setattr(gateway_outbox.FAILED_ATTEMPTS, "clock", lambda: fake_now[0])
    name = f"down-{uuid.uuid4().hex[:8]}"
    destination = f"critical:{name}"
    rows = OutboxStore(store.engine)
    policy = RetryPolicy(first_delay_s=0.1, max_delay_s=0.1, give_up_after_s=float("inf"))
    url = f"http://127.0.0.1:{closed_port()}/hook"
    box = CriticalOutbox(rows, [Receiver(name, url, timeout_s=2.0)], policy=policy)
    caplog.set_level(logging.INFO, logger="radserve")
    try:
        for n in range(NOTICES):
            box.enqueue({"id": f"n-{n}", "study_instance_uid": "1.2.3"}, folder=tmp_path / "out")
        later = utc_now()
        for _ in range(ROUNDS):  # each round a second on: every row is due again
            later += dt.timedelta(seconds=1)
            assert box.deliver_pending(later).retried == NOTICES
        attempts = sorted(r.attempts for r in rows.items(kind=OutboxKind.CRITICAL))
        assert attempts == [ROUNDS] * NOTICES  # every attempt recorded on its row
        [first] = failure_lines(caplog, destination)
        assert "cannot reach the receiver" in first

        fake_now[0] += 61.0  # a minute on, still down: one line, counting the rest
        box.deliver_pending(later + dt.timedelta(seconds=1))
        lines = failure_lines(caplog, destination)
        assert len(lines) == 2
        assert f"{ROUNDS * NOTICES - 1} more failed attempts to it not logged" in lines[1]

        with FhirServer() as back:  # the receiver is back: one line says what was held
            box.receivers[destination] = Receiver(name, back.url)
            report = box.deliver_pending(later + dt.timedelta(seconds=2))
        assert report.sent == NOTICES
        back_lines = [r.getMessage() for r in caplog.records if "reachable again" in r.getMessage()]
        assert back_lines == [
            f"outbox: {destination} reachable again; {NOTICES - 1} failed attempts to it "
            "were not logged"
        ]
    finally:
        box.close()
