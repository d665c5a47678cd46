"""What a DIMSE message may make the storage SCP hold in memory while it arrives.

pynetdicom gathers a message's command set fragments in memory, and any data set it
does not write to a file (every message but a C-STORE-RQ: a C-ECHO-RQ whose command
declares a data set, data set fragments sent before any command). The receive limit
counted only data set bytes, against ``ingest.max_file_bytes`` (4 GiB): a peer sending
command fragments that never ended took a receiving process up by the 300 MB it sent
(kept after the association ended), and data set fragments of a C-ECHO-RQ up to 4 GiB
per association (operator trial, 2026-12-07). Now a command set past
``MAX_COMMAND_BYTES`` and a data set held in memory past ``ingest.max_header_bytes``
abort the association, as an oversize C-STORE does; a C-STORE larger than that bound
(its data set goes to a file) is still stored.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE
from pynetdicom.association import Association
from pynetdicom.dsutils import encode
from pynetdicom.sop_class import CTImageStorage, Verification
from tests.factories.dicom_net import small_study
from tests.factories.waits import wait_until

from radserve.gateway import CompletedStudy, GatewaySCP, Peer, ScpConfig
from radserve.gateway.receive_limit import MAX_COMMAND_BYTES, Exceeded

MEMORY_BOUND = 1 << 20  # ingest.max_header_bytes of this SCP
FRAGMENT = 64 * 1024


@pytest.fixture
def scp(tmp_path: Path) -> Iterator[tuple[GatewaySCP, list[Exceeded]]]:
    refused: list[Exceeded] = []
    config = ScpConfig(
        data_dir=tmp_path / "gateway",
        port=0,
        quiet_s=60.0,
        max_header_bytes=MEMORY_BOUND,
        allowed_peers=(Peer("EDGE", "127.0.0.1"),),
    )
    studies: list[CompletedStudy] = []
    with GatewaySCP(config, studies.append, on_oversize=refused.append) as server:
        yield server, refused


def _associate(scp: GatewaySCP) -> Association:
    ae = AE("EDGE")
    ae.acse_timeout = ae.network_timeout = ae.dimse_timeout = 30
    ae.add_requested_context(Verification)
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    assert assoc.is_established
    return assoc


def _p_data(assoc: Association, control: int, data: bytes) -> bytes:
    """One P-DATA-TF PDU of one PDV (PS3.8 9.3.5): ``control`` 1 a command fragment, 0 a
    data set fragment (bit 2: the last)."""
    context = assoc.accepted_contexts[0].context_id
    item = struct.pack(">IBB", 2 + len(data), context, control) + data
    return b"\x04\x00" + struct.pack(">I", len(item)) + item


def _send_until_aborted(assoc: Association, pdu: bytes, most: int) -> int:
    """Send ``pdu`` until the SCP ends the association (or ``most`` bytes); bytes sent
    (what the connection took, not what the SCP read)."""
    sent = 0
    sock = assoc.dul.socket.socket
    try:
        while sent < most and assoc.is_established:
            sock.sendall(pdu)
            sent += len(pdu)
    except OSError:
        pass  # the SCP closed the connection: what is asserted next
    return sent


def _echo_declaring_a_data_set() -> bytes:
    command = Dataset()
    command.AffectedSOPClassUID = Verification
    command.CommandField = 0x0030  # C-ECHO-RQ
    command.MessageID = 1
    command.CommandDataSetType = 0x0001  # a data set follows
    return bytes(encode(command, True, True))


@pytest.mark.parametrize("what", ["command_set", "echo_data_set", "data_set_first"])
def test_a_message_held_in_memory_is_bounded(
    scp: tuple[GatewaySCP, list[Exceeded]], what: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, refused = scp
    caplog.set_level(logging.WARNING, logger="radserve.gateway.receive_limit")
    assoc = _associate(server)
    sock = assoc.dul.socket.socket
    if what == "command_set":  # command fragments, never the last
        pdu, bound = _p_data(assoc, 0x01, b"\x00" * FRAGMENT), MAX_COMMAND_BYTES
    else:
        if what == "echo_data_set":
            sock.sendall(_p_data(assoc, 0x03, _echo_declaring_a_data_set()))
        pdu, bound = _p_data(assoc, 0x00, b"\x00" * FRAGMENT), MEMORY_BOUND
    # 32 times the bound (socket buffers take in a few MB before the abort is seen):
    # before, all of it was taken in and the association stayed up
    _send_until_aborted(assoc, pdu, 32 * bound)
    assert wait_until(lambda: not assoc.is_established, 10), "the SCP took it all in"
    assert refused and refused[-1].limit_bytes == bound
    assert refused[-1].received_bytes <= bound + FRAGMENT
    assert any("aborted" in r.getMessage() for r in caplog.records)


def test_a_c_store_larger_than_the_memory_bound_is_still_stored(
    scp: tuple[GatewaySCP, list[Exceeded]], tmp_path: Path
) -> None:
    server, refused = scp
    source = small_study(tmp_path / "study")[0]
    ds = pydicom.dcmread(source)
    block = ds.private_block(0x0009, "RADSERVE TEST", create=True)
    block.add_new(0x00, "OB", b"\x5a" * (3 * MEMORY_BOUND))  # to the spool file, not memory
    assoc = _associate(server)
    try:
        assert assoc.send_c_echo().Status == 0
        status = assoc.send_c_store(ds)
        assert status.Status == 0, status
    finally:
        assoc.release()
    assert not refused
