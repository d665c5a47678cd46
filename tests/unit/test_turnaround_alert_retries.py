"""A deadline-risk alert waiting for a retry does not hold back the alerts after it.

Probe of session 42 (a user trial): with the risk webhook answering 500, alerts went out
strictly one at a time, each retried at +1, +5 and +30 s on the alert thread, so an
URGENT job's alert was first posted 56 s after its risk was seen (another had not gone
out by the stop). Now a retry waits beside the new alerts; one job's alerts still keep
their order (its "cleared" is not posted before its "risk").

Against a real receiver on loopback (raw sockets) that answers by the alert's job."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
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
OK = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
FAILING = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _ByJob:
    """Answers each alert by ``answer(job, event, nth alert of that job)``: True 204,
    False 500; records (job, event) in arrival order."""

    def __init__(self, answer: Callable[[str, str, int], bool]) -> None:
        self.answer = answer
        self.seen: list[tuple[str, str]] = []
        self.taken: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/risk"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                message = read_message(conn)
                if message is None:
                    continue
                alert = json.loads(message[1])
                what = (str(alert["job_id"]), str(alert["event"]))
                with self._lock:
                    nth = sum(1 for seen in self.seen if seen[0] == what[0])
                    self.seen.append(what)
                    ok = self.answer(what[0], what[1], nth)
                    if ok:
                        self.taken.append(what)
                conn.sendall(OK if ok else FAILING)

    def attempts(self, job: str) -> int:
        with self._lock:
            return sum(1 for seen in self.seen if seen[0] == job)

    def taken_now(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.taken)


def _turnaround(tmp_path: Path, url: str) -> tuple[Turnaround, CollectorRegistry]:
    return standalone_turnaround(
        tmp_path,
        FakeClock(1000.0),
        turnaround__risk_margin_s=30.0,
        turnaround__risk_webhook_url=url,
    )


def _predict(turnaround: Turnaround, job: str, finish: float) -> None:
    now = turnaround.scheduler.clock.now()
    turnaround._check_risk([Eta(job, 3, now, finish, finish + 20.0, 1500.0)], {job: OUT}, now)


def test_a_failing_alert_waits_for_its_retry_beside_the_next_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the retry waits shortened (1, 5, 30 s): their number and order are what is tested
    monkeypatch.setattr("radserve.service.turnaround._ALERT_RETRIES", (0.5, 1.0, 2.0))
    receiver = _ByJob(lambda job, event, nth: job != "refused-for-now")
    turnaround, registry = _turnaround(tmp_path, receiver.url)
    turnaround.start()
    try:
        _predict(turnaround, "refused-for-now", 1490.0)  # at risk: its alert gets 500
        until(lambda: receiver.attempts("refused-for-now") == 1, "the first attempt", 30)
        _predict(turnaround, "urgent-one", 1490.0)
        until(
            lambda: ("urgent-one", "job.deadline_risk") in receiver.taken_now(),
            "the next job's alert delivered",
            30,
        )
        # before: delivered only after the failing alert's 4th attempt (36 s on)
        assert receiver.attempts("refused-for-now") < 4
        until(
            lambda: (
                registry.get_sample_value(
                    "radserve_deadline_risk_alerts_dropped_total",
                    {"receiver": "webhook", "reason": "failed"},
                )
                == 1.0
            ),
            "the failing alert settled as failed after its retries",
            30,
        )
        assert receiver.attempts("refused-for-now") == 4  # the first try and 3 retries
    finally:
        turnaround.stop()
        turnaround.store.close()
        receiver.server.close()


def test_one_jobs_cleared_alert_waits_for_its_risk_alert_in_retry(tmp_path: Path) -> None:
    receiver = _ByJob(lambda job, event, nth: not (job == "j" and nth == 0))
    turnaround, _ = _turnaround(tmp_path, receiver.url)
    turnaround.start()
    try:
        _predict(turnaround, "j", 1490.0)  # at risk; its first attempt gets 500
        until(lambda: receiver.attempts("j") == 1, "the risk alert's first attempt", 30)
        _predict(turnaround, "j", 1100.0)  # no longer at risk: a cleared alert
        _predict(turnaround, "other", 1490.0)
        until(lambda: len(receiver.taken_now()) == 3, "three alerts delivered", 30)
    finally:
        turnaround.stop()
        turnaround.store.close()
        receiver.server.close()
    taken = receiver.taken_now()
    assert taken[0] == ("other", "job.deadline_risk")  # not held behind j's retry
    assert taken[1:] == [("j", "job.deadline_risk"), ("j", "job.deadline_risk_cleared")]


def test_alerts_waiting_for_a_retry_at_the_stop_are_counted_not_lost(tmp_path: Path) -> None:
    receiver = _ByJob(lambda job, event, nth: job != "x")
    turnaround, registry = _turnaround(tmp_path, receiver.url)
    turnaround.start()
    try:
        _predict(turnaround, "x", 1490.0)
        until(lambda: receiver.attempts("x") == 1, "the first attempt", 30)
        _predict(turnaround, "x", 1100.0)  # its cleared alert waits behind it
    finally:
        turnaround.stop()
        turnaround.store.close()
        receiver.server.close()

    def dropped(reason: str) -> float:
        labels = {"receiver": "webhook", "reason": reason}
        return registry.get_sample_value("radserve_deadline_risk_alerts_dropped_total", labels)

    # the risk alert failed (no retry at the stop), its cleared alert got its one attempt
    assert dropped("failed") == 2.0 and (dropped("stopped") or 0.0) == 0.0
    assert receiver.attempts("x") == 2
    actions = [r.action for r in turnaround.store.iter_audit()]
    assert "turnaround.risk_alerts_dropped" in actions
