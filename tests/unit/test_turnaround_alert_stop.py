"""Deadline-risk alerts still queued when the server stops: delivered within the stop's
grace to a real loopback webhook receiver, or counted (metric by receiver and reason),
logged and audited when they cannot be, never lost silently."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from tests.factories.turnaround import standalone_turnaround
from tests.factories.waits import wait_until

from radserve.domain.priority import PriorityClass
from radserve.scheduling.clock import FakeClock
from radserve.service.turnaround import RISK_ALERTS_DROPPED, Turnaround
from radserve.turnaround.eta import Eta

OUT = PriorityClass.OUTPATIENT
JOBS = ("j1", "j2", "j3")


class _Webhook(ThreadingHTTPServer):
    """A webhook receiver on loopback that holds each POST until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = threading.Event()
        self.received: list[dict[str, object]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/risk"


class _Handler(BaseHTTPRequestHandler):
    server: _Webhook

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.release.wait(30)
        self.server.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _webhook() -> Iterator[_Webhook]:
    server = _Webhook()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def _turnaround(tmp_path: Path, url: str, grace_s: float) -> tuple[Turnaround, CollectorRegistry]:
    return standalone_turnaround(
        tmp_path,
        FakeClock(1000.0),
        turnaround__risk_webhook_url=url,
        turnaround__risk_alert_grace_s=grace_s,
    )


def _raise_risks(turnaround: Turnaround) -> None:
    """Three jobs predicted past their deadline, whatever the margin: three alerts queued."""
    now = turnaround.scheduler.clock.now()
    etas = [Eta(job, 3, now, 1510.0, 1530.0, 1500.0) for job in JOBS]
    turnaround._check_risk(etas, dict.fromkeys(JOBS, OUT), now)


def _dropped(registry: CollectorRegistry) -> dict[str, float]:
    return {
        reason: registry.get_sample_value(
            "radserve_deadline_risk_alerts_dropped_total",
            {"receiver": "webhook", "reason": reason},
        )
        or 0.0
        for reason in ("queue_full", "failed", "stopped")
    }


def test_alerts_queued_at_stop_are_delivered_within_the_grace(tmp_path: Path) -> None:
    with _webhook() as receiver:
        turnaround, registry = _turnaround(tmp_path, receiver.url, grace_s=20.0)
        turnaround.start()
        try:
            _raise_risks(turnaround)  # the first is held by the receiver, two queued behind
            [alerts] = turnaround._alerts
            stopping = threading.Thread(target=turnaround.stop)
            stopping.start()
            assert wait_until(alerts._stop.is_set, timeout=10)
            receiver.release.set()  # the receiver answers once the stop has begun
            stopping.join(60)
            assert not stopping.is_alive()
            assert sorted(str(m["job_id"]) for m in receiver.received) == list(JOBS)
            assert _dropped(registry) == {"queue_full": 0.0, "failed": 0.0, "stopped": 0.0}
            actions = [r.action for r in turnaround.store.iter_audit()]
            assert RISK_ALERTS_DROPPED not in actions
        finally:
            turnaround.store.close()


def test_alerts_that_cannot_go_out_by_the_stop_are_counted_logged_and_audited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as closed:  # a port nothing listens on: every attempt refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/risk"
    turnaround, registry = _turnaround(tmp_path, url, grace_s=0.0)
    turnaround.start()
    try:
        _raise_risks(turnaround)
        turnaround.stop()
        dropped = _dropped(registry)
        assert dropped["queue_full"] == 0.0
        assert dropped["failed"] + dropped["stopped"] == len(JOBS)
        [record] = [r for r in turnaround.store.iter_audit() if r.action == RISK_ALERTS_DROPPED]
        assert record.payload["total"] == len(JOBS)
        assert record.payload["grace_s"] == 0.0
        assert sum(record.payload["dropped"]["webhook"].values()) == len(JOBS)
        assert f"deadline-risk alerts: {len(JOBS)} not delivered by the stop" in caplog.text
    finally:
        turnaround.store.close()
