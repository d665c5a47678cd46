"""The console's sessions and failed sign-ins in the store (radserve.store.console), on
SQLite and PostgreSQL, through two stores on one database as two replicas see it: a
session opened through one is read, touched and closed through the other; a revoked
key's session ends; ended sessions and old failures are swept; failures add up, a
success takes back only its own attempt, and attempts made at once count each other."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import text
from tests.factories.postgres import store_on

from radserve.console.limits import SignInLimiter
from radserve.console.sessions import SessionTable
from radserve.store import Store, init_store
from radserve.store.console import SigninAttempt
from radserve.store.records import utc_now

IDLE, TTL = 600.0, 3600.0


@pytest.fixture(params=["sqlite", "postgresql"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two stores on one database: replica A's and replica B's."""
    with store_on(request.param, tmp_path, "radserve_console") as a:
        b = init_store(a.engine.url.render_as_string(hide_password=False))
        try:
            yield a, b
        finally:
            b.close()


def _tables(stores: tuple[Store, Store], now: list[float]) -> tuple[SessionTable, SessionTable]:
    start = utc_now()

    def clock() -> dt.datetime:
        return start + dt.timedelta(seconds=now[0])

    return (
        SessionTable(stores[0], ttl_s=TTL, idle_s=IDLE, touch_s=10, clock=clock),
        SessionTable(stores[1], ttl_s=TTL, idle_s=IDLE, touch_s=10, clock=clock),
    )


def _rows(store: Store, table: str) -> list[tuple[object, ...]]:
    with store.engine.connect() as connection:
        return [tuple(r) for r in connection.execute(text(f"SELECT * FROM {table}")).all()]


def test_a_session_opened_on_one_replica_is_read_touched_and_closed_on_the_other(
    stores: tuple[Store, Store],
) -> None:
    now = [0.0]
    a, b = _tables(stores, now)
    key, _ = stores[0].create_api_key(name="reading room", role="read", site="north")
    session_id, opened = a.open(key.id, "read", key_name=key.name, site="north")
    [row] = _rows(stores[0], "console_sessions")
    assert session_id not in repr(row)  # only its SHA-256 is stored
    seen = b.get(session_id)
    assert seen == opened and (seen.role, seen.site, seen.csrf) == ("read", "north", opened.csrf)
    assert b.get(session_id + "x") is None and b.get(None) is None
    now[0] = 5.0  # within touch_s: nothing written
    assert b.get(session_id).last_seen == opened.last_seen
    now[0] = 500.0  # the idle clock restarts (written: A sees it)
    assert b.get(session_id).last_seen == opened.last_seen + dt.timedelta(seconds=500)
    now[0] = 1000.0  # 500 s after the last use: still within the idle timeout on A
    assert a.get(session_id) is not None
    b.close(session_id)  # signed out through B: gone on A at once
    assert a.get(session_id) is None
    assert _rows(stores[0], "console_sessions") == []


def test_a_revoked_key_s_session_ends_on_every_replica(stores: tuple[Store, Store]) -> None:
    a, b = _tables(stores, [0.0])
    key, _ = stores[0].create_api_key(name="desk", role="admin")
    session_id, _ = a.open(key.id, "admin")
    assert b.get(session_id) is not None
    stores[1].revoke_api_key(key.id)
    assert a.get(session_id) is None
    assert _rows(stores[0], "console_sessions") == []  # deleted, not just refused
    # a local user's session has no key row: it is not refused for want of one
    user_id, _ = a.open("user:alice", "read", user="alice", user_check="f" * 64)
    assert b.get(user_id).user == "alice"


def test_ended_sessions_end_and_are_swept(stores: tuple[Store, Store]) -> None:
    now = [0.0]
    a, b = _tables(stores, now)
    key, _ = stores[0].create_api_key(name="desk", role="read")
    idle_one, _ = a.open(key.id, "read")
    now[0] = 300.0
    long_one, _ = a.open(key.id, "read")
    now[0] = IDLE  # the first was last used IDLE ago
    assert b.get(idle_one) is None
    for step in range(1, 8):  # used every 550 s: only the absolute expiry ends it
        now[0] = 300.0 + step * 550.0
        assert (b.get(long_one) is not None) == (now[0] < 300.0 + TTL), now[0]
    # a third session left unused: swept when another opens after it ended
    now[0] = 10_000.0
    a.open(key.id, "read")
    now[0] = 10_000.0 + IDLE + 1
    a.open(key.id, "read")
    assert len(_rows(stores[0], "console_sessions")) == 1


def _limiters(
    stores: tuple[Store, Store], now: list[float], max_failures: int
) -> tuple[SignInLimiter, SignInLimiter]:
    start = utc_now()

    def clock() -> dt.datetime:
        return start + dt.timedelta(seconds=now[0])

    return (
        SignInLimiter(stores[0], max_failures=max_failures, window_s=60, clock=clock),
        SignInLimiter(stores[1], max_failures=max_failures, window_s=60, clock=clock),
    )


def test_failed_sign_ins_add_up_over_replicas_and_old_ones_are_swept(
    stores: tuple[Store, Store],
) -> None:
    now = [0.0]
    a, b = _limiters(stores, now, 4)
    taken = [a.take("10.0.0.9"), b.take("10.0.0.9"), a.take("10.0.0.9")]
    assert [t.failures for t in taken] == [1, 2, 3]
    assert not any(a.blocks(t) for t in taken)
    now[0] = 30.0
    assert b.blocks(b.take("10.0.0.9"))  # the 4th, counted across both
    refused = a.take("10.0.0.9")
    assert refused.id is None and a.retry_after(refused) == pytest.approx(30.0)
    assert b.take("10.0.0.7").id is not None
    now[0] = 200.0
    assert a.take("10.0.0.9").id is not None  # sweeps the failures older than the window
    assert [r[1] for r in _rows(stores[0], "console_signin_failures")] == ["10.0.0.9"]
    odd = "x" * 200  # longer than the column: counted by its first 64 characters
    assert [a.blocks(a.take(odd)) for _ in range(4)] == [False, False, False, True]
    refused = b.take(odd + "y")
    assert refused.id is None and b.retry_after(refused) == pytest.approx(60.0)


def test_a_sign_in_that_succeeds_is_no_failure_and_the_earlier_ones_stay(
    stores: tuple[Store, Store],
) -> None:
    a, b = _limiters(stores, [0.0], 2)
    a.take("10.0.0.9")  # a wrong password
    a.forgive(a.take("10.0.0.9"))  # then the right one: it signed in
    third = b.take("10.0.0.9")
    assert third.failures == 2 and b.blocks(third)  # the success reset nothing
    assert a.take("10.0.0.9").id is None


def test_attempts_made_at_once_on_two_replicas_count_each_other(
    stores: tuple[Store, Store],
) -> None:
    """The count is read and the attempt counted in one transaction: of 24 guesses sent
    at once through two replicas, 3 (the limit) are let through, whatever the timing."""
    limiters = _limiters(stores, [0.0], 3)
    start = threading.Barrier(24)

    def guess(i: int) -> SigninAttempt:
        start.wait()
        return limiters[i % 2].take("10.0.0.5")

    with ThreadPoolExecutor(24) as pool:
        taken = list(pool.map(guess, range(24)))
    assert sorted(t.failures for t in taken if t.id is not None) == [1, 2, 3]
    assert [t.failures for t in taken if t.id is None] == [3] * 21
    assert len(_rows(stores[0], "console_signin_failures")) == 3
