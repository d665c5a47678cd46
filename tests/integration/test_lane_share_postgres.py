"""Destinations spread over the servers sharing a PostgreSQL database
(:mod:`radserve.store.lane_share`), against the test server: a server alone takes every
destination; a second one makes the first give one up (one only) and takes it; when the
second one's sessions end as a killed replica's do, the first takes all of them again.
Before the share, the first server kept all three and the second never sent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from tests.factories.postgres import postgres_schema, requires_postgres

from radserve.store.lane_lock import LaneHold, LaneLock, lane_lock
from radserve.store.lane_share import COUNT_EVERY_S, LaneShare

DESTINATIONS = ("PACS", "VNA", "ARCHIVE")
RUN = uuid.uuid4().hex[:8]  # this run's owners: its sessions' names are its own


@pytest.fixture
def engine() -> Iterator[Engine]:
    with postgres_schema("radserve_share") as url:
        engine = create_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()


class Clock:
    """Monotonic seconds that move only when told (the count of servers is cached)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += COUNT_EVERY_S


def _server(engine: Engine, name: str, clock: Clock) -> LaneShare:
    owner = f"{name}/{RUN}"
    locks = [lane_lock(engine, "dicom", d, owner=owner) for d in DESTINATIONS]
    presence = lane_lock(engine, "dicom", "*", owner=owner, shared=True)
    assert presence is not None and all(lock is not None for lock in locks)
    return LaneShare(presence, [lock for lock in locks if lock is not None], clock=clock)


def _held(share: LaneShare) -> set[str]:
    return {lock.destination for lock in share.locks if lock.held}


def _poll(share: LaneShare) -> list[LaneHold]:
    """Every lane of the server looks once, in order (as its workers do, one by one)."""
    return [share.hold(lock) for lock in share.locks]


@requires_postgres
def test_two_servers_share_three_destinations_and_a_survivor_takes_them_all(
    engine: Engine,
) -> None:
    clock = Clock()
    a = _server(engine, "a", clock)
    b = _server(engine, "b", clock)
    locks: list[LaneLock] = [*a.locks, *b.locks]
    try:
        assert _poll(a) == [LaneHold.TAKEN] * 3  # alone: every destination
        assert a.servers() == 1

        assert _poll(b) == [LaneHold.ELSEWHERE] * 3  # two servers now, a holds them all
        assert b.servers() == 2 and b.share() == 2
        clock.tick()
        # a is over its share: its first lane to look gives its destination up, the
        # others keep theirs, and the lane that gave up does not take it back
        assert _poll(a) == [LaneHold.ELSEWHERE, LaneHold.HELD, LaneHold.HELD]
        assert _poll(a) == [LaneHold.ELSEWHERE, LaneHold.HELD, LaneHold.HELD]
        assert _poll(b) == [LaneHold.TAKEN, LaneHold.ELSEWHERE, LaneHold.ELSEWHERE]
        assert (_held(a), _held(b)) == ({"VNA", "ARCHIVE"}, {"PACS"})
        clock.tick()
        assert _poll(a) == [LaneHold.ELSEWHERE, LaneHold.HELD, LaneHold.HELD]  # stable
        assert _poll(b) == [LaneHold.HELD, LaneHold.ELSEWHERE, LaneHold.ELSEWHERE]

        # b's sessions end as a killed replica's do: its locks and its presence go
        # with a timeout pg_terminate_backend waits for the session to end (PostgreSQL 14+);
        # without one it only signals, and a lock could still be held at the next poll
        with engine.connect() as connection:
            ended = connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                    "WHERE application_name LIKE :name"
                ),
                {"name": f"radserve % b/{RUN}"},
            ).all()
        assert ended == [(True,), (True,)]  # PACS's lane lock and the senders lock
        clock.tick()
        assert _poll(a) == [LaneHold.TAKEN, LaneHold.HELD, LaneHold.HELD]
        assert a.servers() == 1 and _held(a) == set(DESTINATIONS)
    finally:
        for lock in locks:
            lock.release()
        a.release()
        b.release()
