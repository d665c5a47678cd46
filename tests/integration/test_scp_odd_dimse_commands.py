"""Malformed DIMSE commands a sender may put on the wire, answered in radserve's words.

- A C-STORE-RQ whose command set lacks the Affected SOP Instance UID: pynetdicom fails
  on it in the association's receiving thread, which ended with Python's plain-text
  traceback on stderr (the server's log, whose lines are otherwise JSON records, and
  which a value in an exception's message could reach unredacted). Now one log line,
  and the association ends as before; the next association is served.
- A C-STORE-RQ whose command says no data set follows (Command Data Set Type 0x0101):
  answered 0xC000 "cannot read the instance: TypeError", and logged as an error of the
  server's; now 0xC000 ``instance_invalid: the C-STORE request carries no data set``.

(operator trial, 2026-12-07)
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE, evt
from pynetdicom.association import Association
from pynetdicom.dsutils import encode
from pynetdicom.sop_class import CTImageStorage, Verification
from tests.factories.dicom_net import edge_scp, small_study
from tests.factories.waits import wait_until

from radserve.gateway import GatewaySCP


@pytest.fixture
def scp(tmp_path: Path) -> Iterator[GatewaySCP]:
    with edge_scp(tmp_path / "gateway") as server:
        yield server


def _associate(scp: GatewaySCP, received: list[Dataset] | None = None) -> Association:
    """An association to ``scp``; ``received``: where the command set of every DIMSE
    message the SCP sends goes."""
    ae = AE("EDGE")
    ae.acse_timeout = ae.network_timeout = ae.dimse_timeout = 30
    ae.add_requested_context(CTImageStorage)
    ae.add_requested_context(Verification)
    handlers = []
    if received is not None:
        handlers.append(
            (evt.EVT_DIMSE_RECV, lambda event: received.append(event.message.command_set))
        )
    assoc = ae.associate(*scp.address, ae_title="RADSERVE", evt_handlers=handlers)
    assert assoc.is_established
    return assoc


def _send_command(assoc: Association, command: Dataset) -> None:
    """``command`` as one last command fragment on the CT context (PS3.8 9.3.5)."""
    context = next(
        cx.context_id for cx in assoc.accepted_contexts if cx.abstract_syntax == CTImageStorage
    )
    data = bytes(encode(command, True, True))
    item = struct.pack(">IBB", 2 + len(data), context, 0x03) + data
    assoc.dul.socket.socket.sendall(b"\x04\x00" + struct.pack(">I", len(item)) + item)


def _store_command(**values: Any) -> Dataset:
    command = Dataset()
    command.AffectedSOPClassUID = CTImageStorage
    command.CommandField = 0x0001  # C-STORE-RQ
    command.MessageID = 7
    command.Priority = 0
    for keyword, value in values.items():
        setattr(command, keyword, value)
    return command


def test_a_store_command_without_its_instance_uid_ends_the_association_in_one_line(
    scp: GatewaySCP, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    died: list[BaseException | None] = []

    def hook(args: threading.ExceptHookArgs) -> None:  # what reaches stderr otherwise
        died.append(args.exc_value)

    monkeypatch.setattr(threading, "excepthook", hook)
    caplog.set_level(logging.ERROR, logger="radserve.gateway.reactor")
    assoc = _associate(scp)
    _send_command(assoc, _store_command(CommandDataSetType=0x0001))  # no instance UID
    assert wait_until(lambda: not assoc.is_established, 10)
    assert died == []  # before: AttributeError, a plain-text traceback
    assert any("receiving thread stopped" in r.getMessage() for r in caplog.records)
    # the connection's slot was given back: the next association is served
    echo = _associate(scp)
    try:
        assert echo.send_c_echo().Status == 0
    finally:
        echo.release()


def test_a_store_command_without_a_data_set_is_refused_saying_so(
    scp: GatewaySCP, tmp_path: Path
) -> None:
    uid = str(pydicom.dcmread(small_study(tmp_path / "s")[0]).SOPInstanceUID)
    answers: list[Dataset] = []
    assoc = _associate(scp, answers)
    try:
        _send_command(assoc, _store_command(AffectedSOPInstanceUID=uid, CommandDataSetType=0x0101))
        assert wait_until(lambda: bool(answers), 10)
    finally:
        assoc.release()
    (response,) = answers
    assert response.Status == 0xC000
    # before: "cannot read the instance: TypeError"
    assert response.ErrorComment == "instance_invalid: the C-STORE request carries no data set"
