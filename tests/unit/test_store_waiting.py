"""The request's bounded wait for the database (radserve.store.waiting) and the 503's
Retry-After it leads to (radserve.api.errors); against a real PostgreSQL in
tests/integration/test_store_wait.py."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from radserve.api.errors import STORE_RETRY_AFTER_S, error_response
from radserve.service.hooks import retry_store
from radserve.store.db import make_engine
from radserve.store.errors import DatabaseUnavailableError, JobNotFoundError
from radserve.store.store import Store
from radserve.store.waiting import StoreWaitExceededError, waiting_for_store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def flaky(clock: Clock, fails_until: float, step_s: float = 0.25) -> Callable[[], str]:
    """A store call that does not answer until ``fails_until`` (each try moves time on)."""

    def call() -> str:
        clock.now += step_s
        if clock.now < fails_until:
            raise DatabaseUnavailableError("database unavailable: OperationalError")
        return "row"

    return call


def test_an_outage_shorter_than_the_wait_is_waited_out() -> None:
    clock = Clock()
    assert waiting_for_store(flaky(clock, 3.0), 5.0, what="x", every_s=0, clock=clock) == "row"
    assert clock.now == 3.0


def test_past_the_wait_the_request_is_refused_with_retry_after() -> None:
    clock = Clock()
    with pytest.raises(StoreWaitExceededError) as raised:
        waiting_for_store(
            flaky(clock, 99.0), 2.5, what="the job row's write", every_s=0, clock=clock
        )
    assert 2.5 <= clock.now < 3.0
    response = error_response(raised.value)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "3"
    assert b"the job row's write" in response.body and b"server.store_wait_s" in response.body


def test_no_wait_refuses_at_once_and_other_errors_pass_through() -> None:
    clock = Clock()
    with pytest.raises(StoreWaitExceededError):
        waiting_for_store(flaky(clock, 99.0), 0.0, what="x", every_s=0, clock=clock)
    assert clock.now == 0.25  # one try

    def missing() -> None:
        raise JobNotFoundError("no job")

    with pytest.raises(JobNotFoundError):
        waiting_for_store(missing, 5.0, what="x", every_s=0, clock=clock)


def _gave_up(
    caplog: pytest.LogCaptureFixture,
    call: Callable[[], object],
    raises: type[DatabaseUnavailableError] = StoreWaitExceededError,
) -> list[str]:
    """What radserve.store.waiting logged for ``call``, which gives up on the database."""
    caplog.set_level(logging.WARNING, logger="radserve.store.waiting")
    with pytest.raises(raises):
        call()
    return [r.getMessage() for r in caplog.records if r.name == "radserve.store.waiting"]


def test_a_call_that_gives_up_without_waiting_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a wait of 0 s (a probe's single try; server.store_wait_s 0) used to log nothing
    clock = Clock()
    said = _gave_up(
        caplog,
        lambda: waiting_for_store(flaky(clock, 99.0), 0.0, what="a probe", every_s=0, clock=clock),
    )
    assert said == [
        "a probe: the database does not answer (database unavailable: OperationalError); "
        "not waiting (1 try in 0.2 s, the wait is 0 s)"
    ]


def test_a_call_that_waited_and_gave_up_logs_two_lines_counting_every_try(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    said = _gave_up(
        caplog,
        lambda: waiting_for_store(flaky(clock, 99.0), 1.0, what="a write", every_s=0, clock=clock),
    )
    assert len(said) == 2, said
    assert said[0].startswith("a write: the database does not answer"), said
    assert said[1] == (
        "a write: the database did not answer for 1.0 s (4 tries); not waiting longer"
    )  # tries at 0.25, 0.5, 0.75 and 1.0 s


def test_a_job_write_that_waited_and_gave_up_counts_its_last_try(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    said = _gave_up(
        caplog,
        lambda: retry_store(flaky(clock, 99.0), (0.0, 0.0), what="job j2: running"),
        DatabaseUnavailableError,
    )
    assert len(said) == 2, said
    assert said[0].startswith("job j2: running: the database does not answer"), said
    assert said[1].startswith("job j2: running: the database did not answer for"), said
    assert said[1].endswith("(3 tries); not waiting longer"), said  # it said 2 before


def test_an_outage_met_outside_a_wait_is_answered_with_retry_after() -> None:
    response = error_response(DatabaseUnavailableError("database unavailable"))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == str(STORE_RETRY_AFTER_S)
    assert "Retry-After" not in error_response(JobNotFoundError("no job")).headers


def test_an_unavailable_database_is_named_by_its_phase_not_the_drivers_text() -> None:
    # a real connection attempt to a port nothing listens on
    store = Store(make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1"))
    try:
        with pytest.raises(DatabaseUnavailableError) as raised:
            store.get_job("x")
    finally:
        store.close()
    assert raised.value.message == "database unavailable: OperationalError: connection refused"
