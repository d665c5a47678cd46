"""Whatever a deadline-risk alert's sending meets, the alert is settled, the alert thread
goes on, and a receiver that fails shows in health until one alert gets through.

Probe of session 37: the alert thread caught only httpx's and socket errors. Any other
exception ended the thread: the alert in hand was lost without a count, every later
alert waited in the queue for good (counted ``stopped`` only at the server's stop), and
metrics and ``/readyz`` said nothing. A non-finite ETA ("an ETA past the calendar",
which the job API already reads as the calendar's last second) did it: httpx refuses to
encode ``Infinity`` (ValueError). And a receiver's own misbehaviour was misread: a 200
whose body could not be decoded, or that was cut after its status, was retried as a
failure (the receiver got the alert again and again, then it counted as failed); a
redirect, which no retry gets past, was retried for 36 s.

Against a real misbehaving receiver on loopback (raw sockets: each connection gets the
next scripted answer) and the turnaround's own alert thread."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from tests.factories.raw_http import read_message
from tests.factories.turnaround import standalone_turnaround
from tests.factories.waits import until

from radserve.domain.priority import PriorityClass
from radserve.scheduling.clock import FakeClock
from radserve.service.turnaround import Turnaround
from radserve.turnaround.eta import Eta

OUT = PriorityClass.OUTPATIENT
ANSWERS = {
    "ok": b"HTTP/1.1 204 No Content\r\n\r\n",
    # a 2xx whose body breaks if anyone decodes it: the status is the acknowledgement
    "garbage": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 12\r\n\r\nnot gzip :-("
    ),
    # closed mid-response: after its status (it took the alert), before it (it did not)
    "cut-in-body": b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"ok": tr',
    "cut-in-status": b"HTTP/1.1 20",
    # a redirect to itself: no retry gets past it (the client follows none)
    "redirect": b"HTTP/1.1 302 Found\r\nLocation: /risk\r\nContent-Length: 0\r\n\r\n",
    "late": b"",  # answers after the client's timeout (5 s)
}


class _Misbehaving:
    """An HTTP receiver on loopback: reads each request whole, keeps its JSON body, then
    answers the next of ``script`` (``ok`` once the script is spent) and closes."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.bodies: list[dict[str, object]] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/risk"
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            message = read_message(conn)
            if message is None:
                return
            _, body = message
            with self._lock:
                self.bodies.append(json.loads(body))
                what = self.script.pop(0) if self.script else "ok"
            if what == "late":
                self._closed.wait(7.0)  # past the 5 s attempt
                what = "ok"
            with contextlib.suppress(OSError):  # the client gave up (the late answer)
                conn.sendall(ANSWERS[what])

    def jobs(self) -> list[object]:
        with self._lock:
            return [b["job_id"] for b in self.bodies]

    def close(self) -> None:
        self._closed.set()
        self.server.close()


@contextmanager
def _receiver(script: list[str]) -> Iterator[_Misbehaving]:
    receiver = _Misbehaving(script)
    try:
        yield receiver
    finally:
        receiver.close()


def _turnaround(tmp_path: Path, url: str) -> tuple[Turnaround, CollectorRegistry]:
    return standalone_turnaround(
        tmp_path,
        FakeClock(1000.0),
        turnaround__risk_margin_s=30.0,
        turnaround__risk_webhook_url=url,
    )


def _raise(turnaround: Turnaround, job: str, finish: float = 1490.0) -> None:
    """``job`` predicted past its deadline minus the margin: an alert queued."""
    now = turnaround.scheduler.clock.now()
    eta = Eta(job, 3, now, finish, finish + 20.0, 1500.0)
    turnaround._check_risk([eta], {job: OUT}, now)


def _dropped(registry: CollectorRegistry, reason: str) -> float:
    labels = {"receiver": "webhook", "reason": reason}
    return registry.get_sample_value("radserve_deadline_risk_alerts_dropped_total", labels) or 0.0


def test_a_misbehaving_receivers_alerts_are_each_settled_and_shown_in_health(
    tmp_path: Path,
) -> None:
    script = ["cut-in-status", "late", "redirect", "garbage", "cut-in-body"]
    with _receiver(script) as receiver:
        turnaround, registry = _turnaround(tmp_path, receiver.url)
        turnaround.start()
        [alerts] = turnaround._alerts
        try:
            # "a": cut before its status (retried), answered late (retried), redirected:
            # refused for good at that answer, not retried past it
            _raise(turnaround, "a")
            until(lambda: _dropped(registry, "failed") == 1.0, "alert a settled as failed", 30)
            assert receiver.jobs() == ["a", "a", "a"]
            problems = turnaround.alert_problems()
            assert list(problems) == ["risk:webhook"], problems
            assert "HTTP 302" in problems["risk:webhook"]
            assert receiver.url not in problems["risk:webhook"]  # it may carry a password
            # "b": 200 with a body that breaks decoding; "c": 200, then cut: both taken
            _raise(turnaround, "b")
            _raise(turnaround, "c")
            until(lambda: alerts.sent == 2, "alerts b and c delivered", 30)
            assert receiver.jobs() == ["a", "a", "a", "b", "c"]  # each once
            assert turnaround.alert_problems() == {}  # one got through: healthy again
            assert alerts.thread is not None and alerts.thread.is_alive()
            assert _dropped(registry, "failed") == 1.0
        finally:
            turnaround.stop()
            turnaround.store.close()


def test_an_alert_the_client_cannot_encode_does_not_end_the_alert_thread(
    tmp_path: Path,
) -> None:
    """An ETA past the calendar (infinite): its alert and the next one are delivered,
    the non-finite times as the calendar's last second and a null lateness."""
    with _receiver([]) as receiver:
        turnaround, registry = _turnaround(tmp_path, receiver.url)
        turnaround.start()
        [alerts] = turnaround._alerts
        try:
            _raise(turnaround, "endless", finish=math.inf)
            _raise(turnaround, "after")
            until(lambda: alerts.sent == 2, "both alerts delivered", 30)
            time.sleep(0.2)  # a failure, were there one, would be counted by now
            assert _dropped(registry, "failed") == 0.0
            assert turnaround.alert_problems() == {}
            (record,) = [
                r for r in turnaround.store.iter_audit()
                if r.action == "job.deadline_risk" and r.subject == "endless"
            ]  # fmt: skip
        finally:
            turnaround.stop()
            turnaround.store.close()
    assert record.payload["predicted_late_by_s"] is None
    endless, after = receiver.bodies
    assert (endless["job_id"], after["job_id"]) == ("endless", "after")
    assert endless["predicted_late_by_s"] is None
    assert str(endless["predicted_finish"]).startswith("9999-12-31T23:59:59")


def test_a_collector_that_accepts_and_never_answers_is_shown_and_the_stop_ends_it(
    tmp_path: Path,
) -> None:
    """The risk collector's timeout at its most (a year until session 38, now
    PEER_TIMEOUT's 300 s), TLS: a collector that accepts the connection and never
    answers holds the attempt in its handshake. Before, health said nothing, and the
    stop left the thread blocked with the alert in hand, neither sent nor counted (no
    metric, no ``turnaround.risk_alerts_dropped`` record)."""
    from radserve.config import PEER_TIMEOUT

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    turnaround, registry = standalone_turnaround(
        tmp_path,
        FakeClock(1000.0),
        turnaround__risk_margin_s=30.0,
        turnaround__risk_alert_grace_s=1.0,
        turnaround__risk_syslog__host="127.0.0.1",
        turnaround__risk_syslog__port=server.getsockname()[1],
        turnaround__risk_syslog__timeout_s=PEER_TIMEOUT.high_s,
    )
    turnaround.start()
    [alerts] = turnaround._alerts
    try:
        _raise(turnaround, "j")
        problems = until(turnaround.alert_problems, "the stalled collector in health", 60)
        assert "an alert has waited" in problems["risk:syslog"], problems
        turnaround.stop()
        assert alerts.thread is not None and not alerts.thread.is_alive()
        labels = {"receiver": "syslog"}
        counted = sum(
            registry.get_sample_value(
                "radserve_deadline_risk_alerts_dropped_total", {**labels, "reason": why}
            )
            or 0.0
            for why in ("failed", "stopped")
        )
        assert counted == 1.0
        actions = [r.action for r in turnaround.store.iter_audit()]
        assert actions == ["job.deadline_risk", "turnaround.risk_alerts_dropped"]
    finally:
        turnaround.store.close()
        server.close()
        for conn in accepted:
            conn.close()


def test_a_receiver_that_keeps_failing_gets_one_log_line_not_one_per_alert(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log limiter (radserve.gateway.attempt_log) on the risk alerts: a receiver that
    refuses every alert logs its first failure, and the alerts failing within the next
    minute are counted, not logged; the first alert that gets through again says how
    many were not logged. Each alert is still counted ``failed`` in the metrics."""
    failing = 6
    with _receiver(["redirect"] * failing) as receiver:  # refused at once: no retry waits
        turnaround, registry = _turnaround(tmp_path, receiver.url)
        turnaround.start()
        [alerts] = turnaround._alerts
        alerts._failure_lines.repeat_s = math.inf  # however slow this host, one line
        try:
            with caplog.at_level(logging.INFO, logger="radserve.service.turnaround"):
                for n in range(failing):
                    _raise(turnaround, f"refused-{n}")
                until(
                    lambda: _dropped(registry, "failed") == float(failing),
                    "every refused alert counted",
                    30,
                )
                _raise(turnaround, "taken")
                until(lambda: alerts.sent == 1, "the next alert delivered", 30)
        finally:
            turnaround.stop()
            turnaround.store.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "radserve.service.turnaround"]
    failed = [line for line in lines if line.startswith("deadline-risk webhook failed")]
    assert len(failed) == 1, failed  # the first failure only, not one line per alert
    again = [line for line in lines if "takes alerts again" in line]
    assert again == [
        f"deadline-risk webhook takes alerts again; {failing - 1} failed alerts were not logged"
    ]
