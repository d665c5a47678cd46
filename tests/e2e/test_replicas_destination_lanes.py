"""One sender per DICOM destination across two real ``radserve serve`` replicas sharing a
PostgreSQL database (a fresh one) and a data folder: each replica receives studies on its
own gateway and sends its results to two destinations, PACS and VNA, each a dcmtk
storescp (a second per C-STORE, so associations last) behind a relay that records every
association. No two associations to one destination ever overlap, while the two
destinations are sent to at the same time; ``radserve_outbox_sender`` names one sender
per destination. The replica sending to PACS is killed with SIGKILL mid-association: the
other takes PACS over (its lock, long before the rows' 10-minute lease) and sends the
rest, to a storescp of the same destination that does not sleep (the relays are
pointed at it after the kill: the 36 sends left took a minute at the sleeping one's
~3 s each); every result reaches both destinations, and an instance reaches one twice only
when the killed sender had it in flight (at least once: that is one instance per
destination per kill, the same SOP Instance UID, which a PACS stores once).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pydicom
import pytest
from sqlalchemy import create_engine
from tests.factories.association_log import AssociationLog
from tests.factories.awkward_peer import storescp
from tests.factories.dicom_net import dcmtk_tool, free_port, storescu
from tests.factories.replicas import fresh_database, rows_of, sender_replica_config
from tests.factories.server_process import start_server, stop_servers
from tests.factories.service import make_study
from tests.factories.waits import until

from radserve.store.db import normalise_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tools,
    pytest.mark.skipif(
        dcmtk_tool("storescp") is None or dcmtk_tool("storescu") is None,
        reason="dcmtk is not installed",
    ),
]
WAIT_S = 600.0
STUDIES_EACH = 3
DESTINATIONS = ("PACS", "VNA")


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def _by_destination(port: int, metric: str = "radserve_outbox_sender") -> dict[str, float]:
    """A per-destination series of the DICOM deliveries on one replica's /metrics."""
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    found = re.findall(rf'^{metric}\{{destination="(\w+)",kind="dicom"\}} (\S+)$', body, re.M)
    return {name: float(value) for name, value in found}


def test_one_sender_per_destination_across_replicas_and_a_killed_sender_is_taken_over(
    tmp_path: Path, database_url: str
) -> None:
    engine = create_engine(normalise_url(database_url))

    rows = rows_of(engine)

    received = {name: tmp_path / f"received-{name}" for name in DESTINATIONS}
    with (
        storescp(received["PACS"], "--sleep-during", "1", "+uf") as pacs,
        storescp(received["VNA"], "--sleep-during", "1", "+uf") as vna,
        storescp(received["PACS"], "+uf") as quick_pacs,
        storescp(received["VNA"], "+uf") as quick_vna,
        AssociationLog(pacs.port) as pacs_log,
        AssociationLog(vna.port) as vna_log,
    ):
        logs = {"PACS": pacs_log, "VNA": vna_log}
        peers = [{"ae_title": name, "host": "127.0.0.1", "port": logs[name].port} for name in logs]
        peers.append({"ae_title": "STORESCU", "host": "127.0.0.1"})  # sends the studies
        replicas: dict[str, subprocess.Popen[bytes]] = {}
        gateways: dict[str, int] = {}
        http: dict[str, int] = {}
        data = tmp_path / "data"  # the shared data folder
        try:
            for name in ("a", "b"):
                gateways[name], http[name] = free_port(), free_port()
                config = sender_replica_config(
                    tmp_path,
                    name,
                    database_url,
                    {
                        "enabled": True,
                        "port": gateways[name],
                        "quiet_s": 0.5,
                        "allowed_peers": peers,
                    },
                )
                replicas[name] = start_server(config, data, http[name], tmp_path / f"{name}.log")
            for i in range(STUDIES_EACH):
                for name in replicas:
                    files = make_study(tmp_path / f"s-{name}{i}")
                    sent = storescu("127.0.0.1", gateways[name], files)
                    assert sent.returncode == 0, sent.stderr
            until(
                lambda: (
                    rows("SELECT count(*) FROM jobs WHERE state = 'succeeded'")[0][0]
                    == 2 * STUDIES_EACH
                ),
                "every study's job to succeed",
                WAIT_S,
            )
            owners = {r[0].split("/")[0] for r in rows("SELECT lease_owner FROM jobs")}
            assert owners == {"replica-a", "replica-b"}  # both replicas produced results

            # one sender per destination, named by its replica's /metrics
            senders = {name: _by_destination(http[name]) for name in replicas}
            for destination in DESTINATIONS:
                assert sum(s[destination] for s in senders.values()) == 1, senders

            def pacs_holder() -> str | None:
                held = rows(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE application_name LIKE 'radserve lane dicom:PACS %'"
                )
                return held[0][0].split()[-1].split("/")[0] if len(held) == 1 else None

            def pacs_mid_send() -> bool:
                states = Counter(
                    r[0]
                    for r in rows(
                        "SELECT state FROM outbox_deliveries "
                        "WHERE destination = 'PACS' AND kind = 'dicom'"
                    )
                )
                return states["sent"] >= 1 and states["sending"] >= 1 and states["pending"] >= 1

            until(pacs_mid_send, "PACS deliveries to be under way", WAIT_S)
            holder = pacs_holder()
            assert holder in ("replica-a", "replica-b")
            victim = replicas[holder.removeprefix("replica-")]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(30)
            survivor = "b" if holder == "replica-a" else "a"
            pacs_log.target, vna_log.target = quick_pacs.port, quick_vna.port

            def all_sent() -> bool:
                states = rows("SELECT DISTINCT state FROM outbox_deliveries WHERE kind = 'dicom'")
                return [r[0] for r in states] == ["sent"]

            until(all_sent, "every result to be sent by the replica left", WAIT_S)
            assert pacs_holder() == f"replica-{survivor}"
            assert _by_destination(http[survivor]) == dict.fromkeys(DESTINATIONS, 1.0)
            taken = _by_destination(http[survivor], "radserve_outbox_taken_over_total")
        finally:
            stop_servers(replicas.values())

        # no two associations to one destination were open at once ...
        for destination, log in logs.items():
            assert len(log.associations) >= 2, destination
            assert log.overlaps() == [], destination
        # ... while the destinations were sent to side by side
        assert any(
            p.opened < (v.closed or p.opened) and v.opened < (p.closed or v.opened)
            for p in pacs_log.associations
            for v in vna_log.associations
        )

    deliveries = rows(
        "SELECT destination, sop_instance_uid, attempts, state FROM outbox_deliveries "
        "WHERE kind = 'dicom'"
    )
    # re-queued on the take-over (nothing else failed): the attempt in flight counted
    requeued = {(d, uid) for d, uid, attempts, _ in deliveries if attempts > 1}
    assert taken["PACS"] == len({uid for d, uid in requeued if d == "PACS"}) >= 1, taken
    for destination in DESTINATIONS:
        uids = Counter(
            str(pydicom.dcmread(path, stop_before_pixels=True).SOPInstanceUID)
            for path in received[destination].iterdir()
        )
        expected = {uid for d, uid, _, _ in deliveries if d == destination}
        assert set(uids) == expected, destination  # nothing lost
        twice = {uid for uid, n in uids.items() if n > 1}
        assert all(n <= 2 for n in uids.values()), destination
        assert len(twice) <= 1, (destination, twice)  # the one in flight at the kill
        assert twice <= {uid for d, uid in requeued if d == destination}
    engine.dispose()
