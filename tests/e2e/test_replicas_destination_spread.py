"""Three DICOM destinations spread over two real ``radserve serve`` replicas sharing a
PostgreSQL database (a fresh one): the replica started first sends to all three while it
is alone; once the second is up, each destination has one sender and the second replica
is one of them (before :mod:`radserve.store.lane_share` the first kept all three); the
second killed with SIGKILL, the first sends to all three again. Senders are read from
each replica's ``radserve_outbox_sender``; no study is needed to hold a destination."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.replicas import fresh_database, sender_replica_config
from tests.factories.server_process import start_server, stop_servers
from tests.factories.waits import until

pytestmark = pytest.mark.slow
WAIT_S = 120.0
DESTINATIONS = ("PACS", "VNA", "ARCHIVE")


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def _sends_to(port: int) -> set[str]:
    """The destinations one replica's /metrics says it is the sender of."""
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    found = re.findall(
        r'^radserve_outbox_sender\{destination="(\w+)",kind="dicom"\} (\S+)$', body, re.M
    )
    return {name for name, value in found if float(value) == 1.0}


def test_two_replicas_share_three_destinations_and_the_survivor_takes_all(
    tmp_path: Path, database_url: str
) -> None:
    # nobody listens at the destinations: nothing is sent, the senders are what is watched
    peers = [{"ae_title": name, "host": "127.0.0.1", "port": free_port()} for name in DESTINATIONS]
    replicas: dict[str, subprocess.Popen[bytes]] = {}
    http: dict[str, int] = {}

    def start(name: str) -> None:
        http[name] = free_port()
        gateway = {"enabled": True, "port": free_port(), "allowed_peers": peers}
        config = sender_replica_config(tmp_path, name, database_url, gateway)
        replicas[name] = start_server(
            config, tmp_path / "data", http[name], tmp_path / f"{name}.log"
        )

    def senders() -> dict[str, set[str]]:
        return {name: _sends_to(http[name]) for name, p in replicas.items() if p.poll() is None}

    try:
        start("a")
        alone = {"a": set(DESTINATIONS)}
        until(lambda: senders() == alone, "replica a alone to send to all", WAIT_S, step=0.5)
        start("b")

        def spread() -> bool:
            now = senders()
            one_each = sorted(d for held in now.values() for d in held) == sorted(DESTINATIONS)
            return one_each and len(now["a"]) == 2 and len(now["b"]) == 1

        until(spread, "one sender each, replica b one of them", WAIT_S, state=senders, step=0.5)
        os.kill(replicas["b"].pid, signal.SIGKILL)
        replicas["b"].wait(30)
        until(lambda: senders() == alone, "a to take all back", WAIT_S, state=senders, step=0.5)
    finally:
        stop_servers(replicas.values())
