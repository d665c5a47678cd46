"""``server.read_processes``: a real ``radserve serve`` whose job status and report reads
are answered by reader processes on the public port while studies process; every report
read is in the audit chain, the metrics count them, a killed reader is replaced, and no
reader or audit writer outlives the serving process (stopped or killed)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.factories.dicom_net import free_port
from tests.factories.postgres import postgres_schema
from tests.factories.server_process import (
    audit_writers_of,
    create_key_cli,
    readers_of,
    start_server,
)
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.waits import WAIT_SCALE, until

from radserve.config import load_settings
from radserve.store.audited import open_audited

N_JOBS = 4


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The store every process shares: SQLite (WAL) by default, or PostgreSQL."""
    if request.param == "sqlite":
        yield {}
    else:
        with postgres_schema("radserve_readers") as url:
            yield {"database_url": url}


@pytest.mark.slow
def test_reads_from_reader_processes_are_audited_and_a_killed_reader_is_replaced(
    tmp_path: Path, database: dict[str, Any]
) -> None:
    config = config_file(tmp_path, server={"read_processes": 2}, **database)
    data, log = tmp_path / "data", tmp_path / "server.log"
    key = create_key_cli(config, data)
    studies = [make_study(tmp_path / f"study-{i}") for i in range(N_JOBS)]
    port = free_port()
    server = start_server(config, data, port, log)
    url = f"http://127.0.0.1:{port}"
    report_reads = 0
    states_seen: set[str] = set()
    try:
        assert len(readers_of(server.pid)) == 2
        assert len(audit_writers_of(server.pid)) == 1  # one for all readers
        with httpx.Client(base_url=url, timeout=60) as c:
            ids = []
            for files in studies:  # submissions are forwarded to the serving process
                r = c.post("/v1/studies", files=upload(files), headers=auth(key))
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            states: dict[str, str] = {}

            def all_succeeded() -> bool:  # reads while the studies process
                nonlocal report_reads
                jobs = [c.get(f"/v1/jobs/{i}", headers=auth(key)) for i in ids]
                assert all(r.status_code == 200 for r in jobs), [r.text for r in jobs]
                states.update({r.json()["id"]: r.json()["state"] for r in jobs})
                states_seen.update(states.values())
                for job_id, state in states.items():
                    if state == "succeeded":
                        r = c.get(f"/v1/jobs/{job_id}/report", headers=auth(key))
                        assert r.status_code == 200, r.text
                        assert r.json()["job_id"] == job_id
                        report_reads += 1
                return all(s == "succeeded" for s in states.values())

            until(all_succeeded, "every study's job to succeed", 120, state=lambda: states, step=0)
            assert report_reads >= N_JOBS
            # the same behaviour as the serving process: no key, an unknown job
            assert c.get(f"/v1/jobs/{ids[0]}").status_code == 401  # forwarded: no key
            refused = c.get(f"/v1/jobs/{ids[0]}/report", headers=auth("rsk_not-a-key"))
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthenticated"
            missing = c.get("/v1/jobs/nope/report", headers=auth(key))
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "job_not_found"
            # a job's deliveries: forwarded to the serving process (no destination here)
            sent = c.get(f"/v1/jobs/{ids[0]}/deliveries", headers=auth(key))
            assert sent.status_code == 200, sent.text
            assert sent.json() == {"job_id": ids[0], "deliveries": []}
            # one Date header, the reader's: the serving process's was passed on beside it
            for answered in (sent, refused, r):
                assert len(answered.headers.get_list("date")) == 1, answered.headers
            # the readers' requests reach the serving process's /metrics (sent in batches)
            until(
                lambda: _reports_counted(c) >= report_reads,
                "the readers' report requests in /metrics",
                10,
                state=lambda: _reports_counted(c),
            )

            killed = next(iter(readers_of(server.pid)))
            os.kill(killed, signal.SIGKILL)
            until(
                lambda: killed not in readers_of(server.pid), "the killed reader to be reaped", 30
            )
            until(
                lambda: len(readers_of(server.pid)) == 2,
                "a reader started in the killed one's place",
                60,
                state=lambda: readers_of(server.pid),
            )
            for job_id in ids:  # new connections: whichever reader takes them answers
                with httpx.Client(base_url=url, timeout=60) as fresh:
                    assert wait_job(fresh, job_id, key)["state"] == "succeeded"

            writer = next(iter(audit_writers_of(server.pid)))
            os.kill(writer, signal.SIGKILL)  # nothing in flight: no read half-audited
            until(
                lambda: audit_writers_of(server.pid) - {writer},
                "an audit writer started in the killed one's place",
                60,
            )
            for job_id in ids:  # refused (503, retryable) until the new writer listens
                with httpx.Client(base_url=url, timeout=60) as fresh:
                    answered = until(
                        lambda job_id=job_id, fresh=fresh: _audited_report(fresh, job_id, key),
                        "a report read audited by the new audit writer",
                        60,
                    )
                    assert answered.json()["job_id"] == job_id
                    report_reads += 1
            with httpx.Client(base_url=url, timeout=60) as fresh:
                metrics = fresh.get("/metrics").text
            for process in ("reader", "audit_writer"):
                assert f'radserve_api_process_restarts_total{{process="{process}"}} 1.0' in metrics
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) in (0, -signal.SIGTERM)
    finally:
        if server.poll() is None:
            server.kill()
    assert "starting another" in log.read_text()
    assert "queued" in states_seen or "running" in states_seen  # read while processing

    store, _ = open_audited(load_settings(config, data_dir=data))
    try:
        reads = [r for r in store.iter_audit() if r.action == "phi.read"]
        assert store.verify_audit().ok
    finally:
        store.close()
    assert len([r for r in reads if r.subject in ids]) == report_reads


@pytest.mark.slow
def test_no_reader_or_audit_writer_outlives_a_killed_serving_process(tmp_path: Path) -> None:
    """A crash (kill -9) of the serving process leaves no reader, no audit writer and no
    resource tracker behind: their pipes to the serving process break and each stops
    itself (what a restart on the same port relies on). The stop (SIGTERM) case ends
    :func:`test_metrics_give_each_process_its_own_process_series` (its own server)."""
    server, _ = _serve_with_readers(tmp_path)
    _stop_and_check_no_survivors(server, signal.SIGKILL)


def _stop_and_check_no_survivors(server: subprocess.Popen[bytes], stop: signal.Signals) -> None:
    """Stop ``server`` with ``stop``; none of its children may outlive it."""
    try:
        children = psutil.Process(server.pid).children(recursive=True)
        assert len(children) >= 3, [p.cmdline()[:3] for p in children]
        server.send_signal(stop)
        assert server.wait(60) in ((0, -stop) if stop == signal.SIGTERM else (-stop,))
        _, alive = psutil.wait_procs(children, timeout=30 * WAIT_SCALE)
        survivors = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not survivors, [(p.pid, p.cmdline()) for p in survivors]
    finally:
        if server.poll() is None:
            server.kill()


@pytest.mark.slow
def test_metrics_give_each_process_its_own_process_series(tmp_path: Path) -> None:
    """``/metrics`` has the ``process_*`` series of the serving process, each reader and
    the audit writer, one per process (label ``process``), each what ``/proc`` of that
    PID says: CPU seconds between two reads of ``/proc`` around the scrape. Then the
    server is stopped (SIGTERM) and none of its processes may outlive it."""
    server, port = _serve_with_readers(tmp_path)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            for _ in range(20):  # requests on the public port: the readers take them
                assert c.get("/healthz").status_code == 200
            pids = [server.pid, *readers_of(server.pid), *audit_writers_of(server.pid)]
            before = {pid: _cpu_seconds(pid) for pid in pids}
            body = c.get("/metrics").text
            after = {pid: _cpu_seconds(pid) for pid in pids}
        series: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name.startswith(("process_", "radserve_process_")):
                    assert set(sample.labels) == {"process"}, sample  # never unlabelled
                    series.setdefault(sample.name, {})[sample.labels["process"]] = sample.value
        labels = {"server", "reader-0", "reader-1", "audit_writer"}
        assert set(series["radserve_process_pid"]) == labels
        named = {name: int(pid) for name, pid in series["radserve_process_pid"].items()}
        assert named["server"] == server.pid
        assert {named["reader-0"], named["reader-1"]} == readers_of(server.pid)
        assert {named["audit_writer"]} == audit_writers_of(server.pid)
        page = os.sysconf("SC_PAGE_SIZE")
        for name, pid in named.items():
            cpu = series["process_cpu_seconds_total"][name]
            assert before[pid] <= cpu <= after[pid], (name, before[pid], cpu, after[pid])
            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            assert abs(series["process_resident_memory_bytes"][name] - rss) <= 0.2 * rss, name
            assert 0 < series["radserve_process_pss_bytes"][name] <= rss * 1.2, name
            assert series["process_open_fds"][name] > 0
        for readers_cpu in ("reader-0", "reader-1"):
            assert series["process_cpu_seconds_total"][readers_cpu] > 0
    except BaseException:
        server.kill()
        raise
    # a stop (SIGTERM) leaves no reader, audit writer or resource tracker behind
    _stop_and_check_no_survivors(server, signal.SIGTERM)


def _serve_with_readers(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A ``radserve serve`` with 2 readers and their audit writer up; its port."""
    config = config_file(tmp_path, server={"read_processes": 2})
    data, port = tmp_path / "data", free_port()
    server = start_server(config, data, port, tmp_path / "server.log")
    try:
        until(
            lambda: len(readers_of(server.pid)) == 2 and audit_writers_of(server.pid),
            "2 readers and their audit writer",
            60,
        )
    except BaseException:
        server.kill()
        raise
    return server, port


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` from ``/proc`` (as the series count them)."""
    fields = Path(f"/proc/{pid}/stat").read_bytes().split(b")")[-1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks + int(fields[12]) / ticks  # summed as prometheus_client does


def _audited_report(client: httpx.Client, job_id: str, key: str) -> httpx.Response | None:
    """The report, or None while the read is refused as retryable (no audit writer yet)."""
    r = client.get(f"/v1/jobs/{job_id}/report", headers=auth(key))
    if r.status_code == 503 and r.json()["error"]["retryable"]:
        return None
    assert r.status_code == 200, r.text
    return r


def _reports_counted(client: httpx.Client) -> float:
    """``radserve_http_requests_total`` of report reads answered 200."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if (
            line.startswith("radserve_http_requests_total{")
            and 'route="/v1/jobs/{job_id}/report"' in line
            and 'status="200"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total
