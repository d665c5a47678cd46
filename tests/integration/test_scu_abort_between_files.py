"""A PACS that aborts the association right after answering a C-STORE, against the
outbox's SCU: a real pynetdicom acceptor on loopback.

Found on 2026-12-07: the SCU checks that the association is up after each file's
result is recorded, then reads the next file's row back (``still_ours``, a database
read) and sends. An A-ABORT landing in between (the PACS aborts a few milliseconds after
its answer; the read is slow on a busy database) made pynetdicom's ``send_c_store`` raise
RuntimeError out of ``StoreSCU.send``: the outbox logged a traceback ("sending to ...
failed") and every remaining file of the batch read "internal error: RuntimeError(...)",
nothing saying that the PACS had ended the association.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from pynetdicom import AE, AllStoragePresentationContexts, evt
from tests.factories.ports import free_port

from radserve.gateway import Destination
from radserve.gateway.scu import Outcome, OutgoingFile, SendResult, StoreSCU
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series

ABORT_AFTER_S = 0.02  # the PACS aborts this long after answering a C-STORE
READ_BACK_S = 0.1  # the caller's look before each file (a row read on a busy database)


@pytest.fixture
def files(tmp_path: Path) -> list[OutgoingFile]:
    phantom = generate_phantom(PhantomSpec.random(7, small=True), range(10, 14))
    out = []
    for key, path in enumerate(write_dicom_series(phantom, tmp_path / "study")):
        header = pydicom.dcmread(path, stop_before_pixels=True)
        out.append(
            OutgoingFile(
                key,
                Path(path),
                str(header.SOPClassUID),
                str(header.file_meta.TransferSyntaxUID),
                str(header.SOPInstanceUID),
            )
        )
    return out


@pytest.fixture
def aborting_peer() -> Iterator[Destination]:
    """Answers each C-STORE with success, then aborts the association."""
    ae = AE(ae_title="ABORTER")
    ae.supported_contexts = AllStoragePresentationContexts

    def on_store(event: Any) -> int:
        threading.Timer(ABORT_AFTER_S, event.assoc.abort).start()
        return 0x0000

    port = free_port()
    server = ae.start_server(
        ("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)]
    )
    try:
        yield Destination("aborter", "ABORTER", "127.0.0.1", port)
    finally:
        server.shutdown()


def test_an_abort_between_two_files_is_a_retry_naming_it_not_an_internal_error(
    aborting_peer: Destination, files: list[OutgoingFile]
) -> None:
    scu = StoreSCU(
        connect_timeout_s=2.0, acse_timeout_s=2.0, dimse_timeout_s=5.0, network_timeout_s=5.0
    )
    results: dict[int, list[SendResult]] = {}

    def read_back(_file: OutgoingFile) -> bool:
        time.sleep(READ_BACK_S)
        return True

    scu.send(
        aborting_peer,
        files,
        lambda file, result: results.setdefault(file.key, []).append(result),
        still_ours=read_back,
    )
    # one result per file, none lost
    assert sorted(results) == [file.key for file in files]
    assert all(len(got) == 1 for got in results.values()), results
    first, *rest = (results[file.key][0] for file in files)
    assert first.outcome is Outcome.SENT
    for result in rest:
        assert result.outcome is Outcome.RETRY, result
        # (or, the abort seen once the first answer was recorded: "the association ...
        # ended at an earlier file")
        assert "ended" in result.message and "association" in result.message, result.message
        assert "RuntimeError" not in result.message
