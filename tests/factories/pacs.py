"""A PACS (a private Orthanc) and radserve's full service (gateway, scheduler, outbox)
wired to each other on loopback ports, for end-to-end gateway tests: Orthanc pushes to
radserve's SCP (modality ``radserve``), radserve's outbox sends results back to Orthanc;
or only Orthanc and an outbox asking it for storage commitment (:func:`committing_pacs`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from radserve.gateway import Destination, GatewaySCP, Outbox, Peer, RetryPolicy, ScpConfig, StoreSCU
from radserve.gateway.commitment import ReportHandler
from radserve.gateway.scu import OutgoingFile, SendResult
from radserve.service import Service
from radserve.store import init_store
from radserve.store.outbox import OutboxStore
from tests.factories.dicom_net import Orthanc, dcmtk_tool
from tests.factories.ports import free_port
from tests.factories.service import settings_for
from tests.factories.waits import WAIT_SCALE, wait_until


def pacs_marks(*dcmtk: str) -> list[pytest.MarkDecorator]:
    """A PACS test's marks: ``tools``, ``slow``, and a skip without Orthanc or one of
    the dcmtk tools ``dcmtk``."""
    missing = ["Orthanc"] if shutil.which("Orthanc") is None else []
    missing += [name for name in dcmtk if dcmtk_tool(name) is None]
    reason = f"not installed: {', '.join(missing)}"
    return [pytest.mark.tools, pytest.mark.slow, pytest.mark.skipif(bool(missing), reason=reason)]


@contextmanager
def pacs_and_gateway(
    root: Path,
    *,
    quiet_s: float = 0.5,
    warm: bool = False,
    orthanc_options: dict[str, Any] | None = None,
    peers_before: tuple[dict[str, Any], ...] = (),
    storage_commitment: bool = False,
    **settings: Any,
) -> Iterator[tuple[Orthanc, Service]]:
    """Orthanc in ``root/orthanc`` and a started :class:`Service` whose only allowed
    peer is that Orthanc (after ``peers_before``, further ``gateway.allowed_peers``
    entries); ``settings`` are further overrides for :func:`settings_for`,
    ``orthanc_options`` for Orthanc's configuration; ``warm``: wait until the workers
    have loaded the models; ``storage_commitment``: radserve asks Orthanc to commit its
    results, and Orthanc may report to radserve's SCP."""
    gateway_port = free_port()
    radserve: Any = ["RADSERVE", "127.0.0.1", gateway_port]
    if storage_commitment:
        radserve = {
            "AET": "RADSERVE",
            "Host": "127.0.0.1",
            "Port": gateway_port,
            "AllowStorageCommitment": True,
        }
    orthanc = Orthanc(root / "orthanc", peers={"radserve": radserve}, options=orthanc_options)
    service = Service(
        settings_for(
            root,
            gateway__enabled=True,
            gateway__port=gateway_port,
            gateway__allowed_peers=[
                *peers_before,
                {
                    "ae_title": "ORTHANC",
                    "host": "127.0.0.1",
                    "port": orthanc.dicom_port,
                    "storage_commitment": storage_commitment,
                },
            ],
            **settings,
        ),
        gateway_options={"quiet_s": quiet_s},
    )
    orthanc.start()
    service.start()
    try:
        if warm:
            assert service.wait_warm(60 * WAIT_SCALE)
        yield orthanc, service
    finally:
        service.stop()
        orthanc.stop()


def terminal_jobs(service: Service, count: int, timeout: float = 90.0) -> list[Any]:
    """The service's jobs, oldest first, once there are ``count`` and all are final."""

    def done() -> bool:
        jobs = service.store.list_jobs(limit=max(10, count)).items
        return len(jobs) >= count and all(j.terminal for j in jobs)

    assert wait_until(done, timeout)
    return list(reversed(service.store.list_jobs(limit=max(10, count)).items))


@contextmanager
def committing_pacs(
    tmp_path: Path,
    *,
    lua: str | None = None,
    scp_running: bool = True,
    timeout_s: float = 60.0,
    attempts: int = 3,
    database_url: str | None = None,
    scu: StoreSCU | None = None,
    receivers: int = 1,
) -> Iterator[tuple[Orthanc, Outbox, OutboxStore, GatewaySCP]]:
    """Orthanc that knows radserve as a modality allowed storage commitment, radserve's
    SCP (started unless ``scp_running`` is false; ``receivers`` processes) and an outbox
    to Orthanc (destination ``pacs``) with storage commitment, sharing one database
    (``database_url``, else SQLite in ``tmp_path``); ``lua``: an Orthanc Lua script."""
    scp_port = free_port()
    options: dict[str, Any] = {}
    if lua is not None:
        script = tmp_path / "filter.lua"
        script.write_text(lua)
        options["LuaScripts"] = [str(script)]
    orthanc = Orthanc(
        tmp_path / "orthanc",
        peers={
            "radserve": {
                "AET": "RADSERVE",
                "Host": "127.0.0.1",
                "Port": scp_port,
                "AllowStorageCommitment": True,
            }
        },
        options=options,
    )
    store = init_store(database_url or f"sqlite:///{tmp_path / 'radserve.db'}")
    rows = OutboxStore(store.engine)
    destination = Destination(
        name="pacs",
        ae_title="ORTHANC",
        host="127.0.0.1",
        port=orthanc.dicom_port,
        storage_commitment=True,
        commitment_timeout_s=timeout_s,
    )
    outbox = Outbox(
        rows,
        [destination],
        scu or StoreSCU(),
        policy=RetryPolicy(first_delay_s=1.0, max_attempts=attempts),
    )
    config = ScpConfig(
        data_dir=tmp_path / "radserve",
        port=scp_port,
        receivers=receivers,
        allowed_peers=[
            Peer("ORTHANC", "127.0.0.1", orthanc.dicom_port, storage_commitment=True),
            Peer("OTHER", "127.0.0.1"),
        ],
    )
    scp = GatewaySCP(config, lambda _: None, on_commitment=outbox.commitments.on_report)
    orthanc.start()
    try:
        if scp_running:
            scp.start()
        yield orthanc, outbox, rows, scp
    finally:
        if scp_running:
            scp.stop()
        orthanc.stop()
        store.close()


class RecordingSCU(StoreSCU):
    """radserve's SCU, noting whether each N-ACTION's association waited for a report;
    ``always_wait``: every one does (the behaviour before session 20)."""

    def __init__(self, *, always_wait: bool = False) -> None:
        super().__init__()
        self.always_wait = always_wait
        self.waited: list[bool] = []

    def request_commitment(
        self,
        destination: Destination,
        transaction_uid: str,
        files: Sequence[OutgoingFile],
        on_report: ReportHandler,
        *,
        wait_for_report: bool = True,
    ) -> SendResult:
        wait_for_report = wait_for_report or self.always_wait
        self.waited.append(wait_for_report)
        return super().request_commitment(
            destination, transaction_uid, files, on_report, wait_for_report=wait_for_report
        )
