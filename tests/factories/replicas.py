"""Two ``radserve serve`` replicas on one database: a fresh database, their settings."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from radserve.store.db import normalise_url
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server, stop_servers
from tests.factories.service import auth, config_file, make_models_slow, upload

TEST_DATABASE_URL = os.environ.get("RADSERVE_TEST_DATABASE_URL")


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new database ``radserve_t_<hex>`` on the test server, dropped afterwards
    (skips without ``RADSERVE_TEST_DATABASE_URL``)."""
    if not TEST_DATABASE_URL:
        pytest.skip("RADSERVE_TEST_DATABASE_URL is not set")
    import psycopg

    base = make_url(normalise_url(TEST_DATABASE_URL))
    name = f"radserve_t_{uuid.uuid4().hex[:12]}"
    conninfo = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rows_of(engine: Engine) -> Callable[[str], list[Any]]:
    """``rows(sql)``: every row a query returns on ``engine`` (a connection each time)."""

    def rows(query: str) -> list[Any]:
        with engine.connect() as connection:
            return list(connection.execute(text(query)).all())

    return rows


def replica_config(
    root: Path,
    name: str,
    url: str,
    fhir_url: str | None,
    *,
    job_lease_s: float,
    outbox_lease_s: float,
    slow: bool = True,
    **sections: Any,
) -> Path:
    """Settings of replica ``name`` (its own folder and, with ``slow``, slow models; the
    shared database ``url``; FHIR delivery to ``fhir_url``; more ``sections``)."""
    folder = root / name
    folder.mkdir()
    outbox = {"replicas": 2, "instance_id": f"replica-{name}", "lease_s": outbox_lease_s}
    fhir = {"fhir": {"url": fhir_url, "timeout_s": 30}} if fhir_url else {}
    config = config_file(
        folder,
        database_url=url,
        jobs={"lease_s": job_lease_s, "lease_poll_s": 0.5},
        outbox={**outbox, **sections.pop("outbox", {})},
        **fhir,
        **sections,
    )
    if slow:
        make_models_slow(folder / "assets" / "models", layers=4, channels=32)
    return config


@dataclass
class LeasedReplicas:
    """Replicas ``a`` and ``b`` running on one database and one data folder."""

    servers: list[subprocess.Popen[bytes]]
    urls: list[str]
    logs: list[Path]
    key: str

    def submit(self, studies: Sequence[list[Path]]) -> list[str]:
        """Upload every study at once, alternating replicas; the job ids (all 202)."""

        def one(i: int) -> str:
            r = httpx.post(
                f"{self.urls[i % 2]}/v1/studies",
                files=upload(studies[i]),
                headers=auth(self.key),
                timeout=120,
            )
            assert r.status_code == 202, r.text
            return str(r.json()["id"])

        with ThreadPoolExecutor(len(studies)) as pool:
            return list(pool.map(one, range(len(studies))))


@contextmanager
def leased_replicas(root: Path, url: str, *, job_lease_s: float) -> Iterator[LeasedReplicas]:
    """Two replicas on database ``url`` with a short job lease, one job at a time each
    (the others wait in its queue, leased), sharing ``root/data``; stopped on exit."""
    data = root / "data"
    configs = [
        replica_config(
            root,
            n,
            url,
            None,
            job_lease_s=job_lease_s,
            outbox_lease_s=5.0,
            server={"store_wait_s": 60.0},
            scheduler={"max_running": 1},
        )
        for n in ("a", "b")
    ]
    logs = [root / "a.log", root / "b.log"]
    ports = [free_port(), free_port()]
    key = create_key_cli(configs[0], data)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        for config, port, log in zip(configs, ports, logs, strict=True):
            servers.append(start_server(config, data, port, log))
        yield LeasedReplicas(servers, [f"http://127.0.0.1:{p}" for p in ports], logs, key)
    finally:
        stop_servers(servers)


UNFINISHED = "state IN ('received', 'queued', 'running')"  # a job not yet at an end state


def unfinished_jobs(rows: Callable[[str], list[Any]], where: str = "TRUE") -> list[str]:
    """Ids of the jobs (matching ``where``) that have not reached an end state."""
    return [job_id for (job_id,) in rows(f"SELECT id FROM jobs WHERE ({where}) AND {UNFINISHED}")]


def per_job(rows: Callable[[str], list[Any]], action: str) -> dict[str, int]:
    """How many audit records of ``action`` (``job.started``...) each job has."""
    return dict(
        rows(
            "SELECT subject, count(*) FROM audit_records "
            f"WHERE action = '{action}' GROUP BY subject"
        )
    )


def sender_replica_config(root: Path, name: str, url: str, gateway: dict[str, Any]) -> Path:
    """Settings of replica ``name`` for the destination-sender tests: quick models, a
    10-minute outbox lease (a take-over there is the lane lock's, not a lease's), senders
    looking every 0.5 s, the DICOM ``gateway`` section given."""
    return replica_config(
        root,
        name,
        url,
        None,
        job_lease_s=15.0,
        outbox_lease_s=600.0,
        slow=False,
        outbox={"lane_poll_s": 0.5},
        gateway=gateway,
    )
