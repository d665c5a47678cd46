"""A replica frozen while it holds a destination's lane lock (SIGSTOP, ``docker pause``, a
VM stunned) keeps its socket open, so PostgreSQL never frees the lock on its own: before,
nobody sent to that destination for as long as it stayed frozen (30 FHIR Bundles waited
45 s while two live replicas idled, ``/readyz`` 200 with no reason). Now the holder
shows its session alive every ``keep_every_s`` even while its lane is busy
(:mod:`radserve.store.lane_lock`), and a server that finds the lane held by a session
silent for longer than ``silent_after_s`` (the database's clock) ends that session and
takes the lane, not before; the frozen holder, once resumed, finds its lock gone before
it sends again. Its senders lock (the share, :mod:`radserve.store.lane_share`) is ended
the same way, so it stops counting among the live servers.

The holder is a real process (a child Python holding real :class:`LaneLock` s on the test
PostgreSQL server), stopped with SIGSTOP and resumed with SIGCONT; the bound is 4 s here
(30 s in service) so the test runs in seconds."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from tests.factories.postgres import postgres_schema, requires_postgres

from radserve.store import Store, init_store
from radserve.store.lane_lock import SILENT_AFTER_S, LaneHold, LaneLock

BOUND_S = 4.0  # a holder silent this long is taken for frozen
KEEP_S = 0.5  # how often a live holder shows its session alive
STUCK_S = 60.0  # a bound for a stuck test only
RUN = uuid.uuid4().hex[:8]

# the frozen replica: holds FHIR's lane and the kind's senders lock, never checks the lane
# itself (as while it sends a long batch), answers "hold" lines with what hold() finds
_HOLDER = textwrap.dedent(
    """
    import sys
    from sqlalchemy import create_engine
    from radserve.store.lane_lock import LaneLock

    url, owner, keep = sys.argv[1], sys.argv[2], float(sys.argv[3])
    engine = create_engine(url)
    lane = LaneLock(engine, "fhir", "FHIR", owner=owner, keep_every_s=keep)
    presence = LaneLock(engine, "fhir", "*", owner=owner, shared=True, keep_every_s=keep)
    print(lane.hold().value, presence.hold().value, flush=True)
    for line in sys.stdin:
        if line.strip() == "hold":
            print(lane.hold().value, lane.held, flush=True)
        else:
            break
    lane.release()
    presence.release()
    """
)


@pytest.fixture
def url() -> Iterator[str]:
    with postgres_schema("radserve_lane_frozen") as schema_url:
        init_store(schema_url).close()  # the tables (the locks need none)
        yield schema_url


def _sessions(store: Store, name: str) -> list[int]:
    with store.engine.connect() as connection:
        return list(
            connection.execute(
                text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
                {"name": name},
            ).scalars()
        )


def _silent_s(store: Store, name: str) -> float:
    """How long the session named ``name`` has been idle, by the database's clock."""
    with store.engine.connect() as connection:
        return float(
            connection.execute(
                text(
                    "SELECT EXTRACT(EPOCH FROM clock_timestamp() - state_change) "
                    "FROM pg_stat_activity WHERE application_name = :name"
                ),
                {"name": name},
            ).scalar_one()
        )


@requires_postgres
def test_a_frozen_holder_s_lane_is_taken_after_the_bound_and_not_before(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert SILENT_AFTER_S == 30.0  # the service's bound: the keepalives' 10 s + 4 x 5 s
    store = init_store(url)
    holder_owner = f"frozen/{RUN}"
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url, holder_owner, str(KEEP_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lane = LaneLock(
        store.engine,
        "fhir",
        "FHIR",
        owner=f"live/{RUN}",
        silent_after_s=BOUND_S,
        keep_every_s=KEEP_S,
    )
    presence = LaneLock(
        store.engine,
        "fhir",
        "*",
        owner=f"live/{RUN}",
        shared=True,
        silent_after_s=BOUND_S,
        keep_every_s=KEEP_S,
    )
    stopped = False
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().split() == ["taken", "taken"]
        assert _sessions(store, f"radserve lane fhir:FHIR {holder_owner}")

        # alive, busy (no hold() of its own) for twice the bound: its keeper keeps the
        # session active, so the lane stays its own and both servers count
        assert presence.hold() is LaneHold.TAKEN
        end = time.monotonic() + 2 * BOUND_S
        while time.monotonic() < end:
            assert lane.hold() is LaneHold.ELSEWHERE
            assert presence.holders() == 2
            time.sleep(0.25)
        assert lane.ended_holders == 0 and presence.ended_holders == 0

        caplog.set_level(logging.WARNING, logger="radserve.store.lane_lock")
        os.kill(child.pid, signal.SIGSTOP)
        stopped = True
        frozen_at = time.monotonic()
        time.sleep(0.1)  # a keep in flight at the stop completes on the server
        quiet_s = _silent_s(store, f"radserve lane fhir:FHIR {holder_owner}")
        took = None
        while time.monotonic() - frozen_at < STUCK_S:
            hold = lane.hold()
            if hold is LaneHold.TAKEN:
                took = time.monotonic() - frozen_at
                break
            assert hold is LaneHold.ELSEWHERE
            time.sleep(0.2)
        assert took is not None, "the frozen holder's lane was never taken"
        # silence counts from its last keep (the database's clock), not from the stop
        assert quiet_s < KEEP_S + 1.0, quiet_s
        assert BOUND_S - 0.3 <= quiet_s + took <= BOUND_S + 5.0, (quiet_s, took)
        assert lane.ended_holders == 1
        assert not _sessions(store, f"radserve lane fhir:FHIR {holder_owner}")
        # its senders lock ended too: it no longer counts among the servers alive
        assert presence.holders() == 1
        assert presence.ended_holders == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        taken_lines = [w for w in warnings if "lane of FHIR was held by a session silent" in w]
        assert len(taken_lines) == 1, warnings
        assert f"radserve lane fhir:FHIR {holder_owner}" in taken_lines[0]
        assert any("server running the fhir lanes was silent" in w for w in warnings)

        # resumed: its first check finds the lock lost, before anything more is sent
        child.stdin.write("hold\n")
        child.stdin.flush()
        os.kill(child.pid, signal.SIGCONT)
        stopped = False
        assert child.stdout.readline().split() == ["elsewhere", "False"]
        assert lane.hold() is LaneHold.HELD  # the live server keeps it
    finally:
        if stopped:
            os.kill(child.pid, signal.SIGCONT)
        if child.poll() is None and child.stdin is not None:
            try:
                child.stdin.write("quit\n")
                child.stdin.flush()
            except BrokenPipeError:
                pass
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        lane.release()
        presence.release()
        store.close()


@requires_postgres
def test_a_live_holder_that_shows_no_activity_of_its_own_keeps_its_lane(url: str) -> None:
    """In one process: the holder's lane never checks its lock (a long batch), yet its
    keeper keeps the session recent, so another lock with a short bound never ends it;
    with the keeper stopped (as in a frozen process) the other takes it after the bound."""
    store = init_store(url)
    holder = LaneLock(store.engine, "dicom", "PACS", owner=f"a/{RUN}", keep_every_s=KEEP_S)
    taker = LaneLock(
        store.engine, "dicom", "PACS", owner=f"b/{RUN}", silent_after_s=2.0, keep_every_s=KEEP_S
    )
    try:
        assert holder.hold() is LaneHold.TAKEN
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            assert taker.hold() is LaneHold.ELSEWHERE
            time.sleep(0.25)
        holder._keeper_stop.set()  # the holder stops answering: what a frozen one shows
        stopped_at = time.monotonic()
        quiet_s = _silent_s(store, f"radserve lane dicom:PACS a/{RUN}")
        while taker.hold() is not LaneHold.TAKEN:
            assert time.monotonic() - stopped_at < STUCK_S
            time.sleep(0.2)
        assert quiet_s + time.monotonic() - stopped_at >= 2.0 - 0.3
        assert holder.hold() is LaneHold.ELSEWHERE and not holder.held
    finally:
        holder.release()
        taker.release()
        store.close()
