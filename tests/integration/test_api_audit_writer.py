"""The API readers' one audit writer process (:mod:`radserve.api.audit_writer`): reads
from several readers share its commits, each read is answered only once its record is
in the store, and when the writer dies the reads waiting on it are refused (retryable)
and the next writer serves the next read."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest

from radserve.api.audit_writer import AuditWriterClient, serve_audit_writer
from radserve.audit import AuditEvent
from radserve.config import Settings, load_settings
from radserve.errors import RadserveError
from radserve.store import Store
from radserve.store.audited import open_audited

READS = 40  # per client


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("RADSERVE_DATABASE_URL", "RADSERVE_CONFIG", "RADSERVE_AUDIT__KEY"):
        monkeypatch.delenv(name, raising=False)
    made = load_settings(None, data_dir=str(tmp_path / "data"))
    made.data_dir.mkdir(parents=True)
    return made


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    opened, _ = open_audited(settings)
    yield opened
    opened.close()


def start_writer(settings: Settings, path: str) -> BaseProcess:
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe(duplex=True)
    process = context.Process(
        target=serve_audit_writer, args=(settings, path, theirs, logging.WARNING, False)
    )
    process.start()
    theirs.close()
    assert mine.poll(60), "the writer did not start"
    assert mine.recv() == "ready"
    process.pipe = mine  # type: ignore[attr-defined]  # kept open: closing it stops the writer
    return process


def read_event(reader: str, i: int) -> AuditEvent:
    return AuditEvent(
        action="phi.read",
        subject=f"job-{reader}-{i}",
        payload={"resource": "report"},
        actor_key_id=reader,
    )


def test_reads_of_two_readers_share_commits_and_are_answered_once_stored(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    path = str(tmp_path / "audit.sock")
    writer = start_writer(settings, path)
    try:

        async def reads() -> list[int]:
            clients = [AuditWriterClient(path), AuditWriterClient(path)]
            seqs: list[int] = []

            async def one(client: AuditWriterClient, reader: str, i: int) -> None:
                record = await asyncio.wrap_future(client.submit(read_event(reader, i)))
                # answered: its record is committed (readable by another connection)
                stored = store.audit_record(record.seq)
                assert stored is not None and stored.subject == f"job-{reader}-{i}"
                seqs.append(record.seq)

            pairs = list(zip(clients, "ab", strict=True))
            await asyncio.gather(*(one(c, name, i) for i in range(READS) for c, name in pairs))
            for client in clients:
                client.close()
            return seqs

        seqs = asyncio.run(reads())
    finally:
        writer.terminate()
        writer.join(30)
    assert writer.exitcode == 0
    assert len(set(seqs)) == 2 * READS
    subjects = [r.subject for r in store.iter_audit() if r.action == "phi.read"]
    assert sorted(subjects) == sorted(f"job-{r}-{i}" for r in "ab" for i in range(READS))
    assert store.verify_audit().ok


def test_a_dead_writer_refuses_the_waiting_reads_and_the_next_writer_serves(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    path = str(tmp_path / "audit.sock")
    client = AuditWriterClient(path)

    async def read(i: int) -> int:
        return (await asyncio.wrap_future(client.submit(read_event("a", i)))).seq

    async def scenario() -> tuple[int, BaseException | None, int]:
        first = start_writer(settings, path)
        seq = await read(1)
        os.kill(first.pid or 0, signal.SIGKILL)
        first.join(30)
        refused: BaseException | None = None
        try:
            await read(2)  # sent into a dead connection, or refused at the connect
        except RadserveError as exc:
            refused = exc
        second = start_writer(settings, path)
        try:
            after = await read(3)
        finally:
            second.terminate()
            second.join(30)
        client.close()
        return seq, refused, after

    seq, refused, after = asyncio.run(scenario())
    assert isinstance(refused, RadserveError) and refused.retryable
    assert after > seq
    subjects = {r.subject for r in store.iter_audit()}
    assert {"job-a-1", "job-a-3"} <= subjects
    assert store.verify_audit().ok


def test_an_event_that_cannot_be_stored_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    client = AuditWriterClient(str(tmp_path / "nobody.sock"))
    with pytest.raises(TypeError, match="not JSON serializable"):
        client.submit(AuditEvent(action="phi.read", payload={"resource": object()}))


def test_no_writer_listening_refuses_the_read_retryably(tmp_path: Path) -> None:
    client = AuditWriterClient(str(tmp_path / "nobody.sock"))

    async def read() -> None:
        await asyncio.wrap_future(client.submit(read_event("a", 0)))

    with pytest.raises(RadserveError, match="not reachable") as caught:
        asyncio.run(read())
    assert caught.value.retryable
