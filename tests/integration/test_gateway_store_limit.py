"""The per-instance size limit holds while a C-STORE arrives (issue 12): dcmtk's storescu
sends an instance far over ``max_file_bytes``; the association is aborted, the spool
folder under the data dir never holds more than the limit (polled while sending),
TMPDIR holds nothing, the peer is audited and logged without patient data, and a normal
study sent right after is accepted. These tests also guard the two pynetdicom hooks of
:mod:`radserve.gateway.receive_limit`: an upgrade that moves them fails here."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import ExplicitVRLittleEndian
from pynetdicom import AE, dimse_messages
from pynetdicom.dimse_messages import C_STORE_RQ
from pynetdicom.dimse_primitives import C_STORE
from pynetdicom.dsutils import encode
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import dcmtk_tool, small_study, storescu
from tests.factories.waits import wait_until

from radserve.audit import Action
from radserve.audit.atna import dicom_audit_message
from radserve.gateway import CompletedStudy, GatewaySCP, Peer, ScpConfig
from radserve.gateway.receive_limit import SPACE_CHECK_BYTES, Exceeded, install
from radserve.service.gateway import audit_oversize
from radserve.store import Store, init_store

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]
LIMIT = 2 * 2**20
META_SLACK = 4096  # preamble and file meta pynetdicom writes before the data set
PHI = "Planted^Patient"


def _bulky(source: Path, target: Path, size: int) -> Path:
    """``source`` with a private OB element of ``size`` bytes and a planted name."""
    ds = pydicom.dcmread(source)
    ds.PatientName = PHI
    block = ds.private_block(0x0009, "RADSERVE TEST", create=True)
    block.add_new(0x00, "OB", b"\x5a" * size)
    ds.save_as(target, enforce_file_format=True)
    return target


class _Watch(threading.Thread):
    """Polls the largest total size of files in ``folders`` until stopped."""

    def __init__(self, *folders: Path) -> None:
        super().__init__(daemon=True)
        self.folders = folders
        self.largest = dict.fromkeys(folders, 0)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for folder in self.folders:
                total = sum(p.stat().st_size for p in folder.glob("*") if p.is_file())
                self.largest[folder] = max(self.largest[folder], total)
            self.stop.wait(0.001)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def test_an_oversize_instance_is_aborted_while_it_arrives(
    tmp_path: Path,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where pynetdicom wrote before
    studies: list[CompletedStudy] = []
    refused: list[Exceeded] = []

    def on_oversize(exceeded: Exceeded) -> None:
        refused.append(exceeded)
        audit_oversize(store, exceeded)

    config = ScpConfig(
        data_dir=tmp_path / "gateway",
        port=0,
        quiet_s=1.0,
        max_file_bytes=LIMIT,
        allowed_peers=(Peer("STORESCU", "127.0.0.1"),),
    )
    files = small_study(tmp_path / "study")
    bulky = _bulky(files[0], tmp_path / "bulky.dcm", 12 * LIMIT)
    with GatewaySCP(config, studies.append, on_oversize=on_oversize) as scp:
        received_in: list[Path] = []
        header = scp._header
        monkeypatch.setattr(
            scp, "_header", lambda p, *syntax: (received_in.append(p.parent), header(p, *syntax))[1]
        )
        watch = _Watch(scp.spool, tmp)
        watch.start()
        try:
            run = storescu(*scp.address, [bulky])
        finally:
            watch.stop.set()
            watch.join()
        # the SCP aborts while storescu still writes: storescu reads the A-ABORT, or (when
        # the SCP has closed first) fails its next write; either way the store failed
        assert run.returncode != 0, run.stderr
        assert "Peer aborted Association" in run.stderr or (
            "Store Failed" in run.stderr and "Broken pipe" in run.stderr
        ), run.stderr
        assert wait_until(lambda: not scp.admission.open_connections(), timeout=10)
        assert watch.largest[scp.spool] <= LIMIT + META_SLACK
        assert watch.largest[tmp] == 0
        assert wait_until(lambda: not any(scp.spool.iterdir()), timeout=10)
        assert [(r.calling_ae, r.address, r.limit_bytes) for r in refused] == [
            ("STORESCU", "127.0.0.1", LIMIT)
        ]
        assert LIMIT < refused[0].received_bytes <= LIMIT + 2 * config.max_pdu_bytes
        assert not received_in  # the handler never saw it
        # a normal study right after: accepted, received through the spool folder
        run = storescu(*scp.address, files)
        assert run.returncode == 0, run.stderr
        assert wait_until(lambda: len(studies) == 1, timeout=20)
        assert len(studies[0].instances) == len(files)
        assert set(received_in) == {scp.spool}
        assert not any(scp.spool.iterdir()) and not any(tmp.iterdir())
    records = [r for r in store.iter_audit() if r.action == Action.GATEWAY_OVERSIZE]
    assert len(records) == 1
    assert records[0].subject == "STORESCU" and records[0].client_address == "127.0.0.1"
    assert records[0].payload["limit_bytes"] == LIMIT
    atna = dicom_audit_message(records[0], source_id="radserve").decode()
    assert 'EventOutcomeIndicator="4"' in atna and "110113" in atna  # ATNA Security Alert
    text = caplog.text + "".join(str(r.to_json()) for r in store.iter_audit())
    assert "aborted: a C-STORE data set passed" in caplog.text
    assert PHI not in text and "Planted" not in text
    assert not any(r.exc_info for r in caplog.records)


def test_a_left_over_spool_file_is_removed_at_start(tmp_path: Path) -> None:
    config = ScpConfig(data_dir=tmp_path / "gateway", port=0)
    spool = config.data_dir / "receiving"
    spool.mkdir(parents=True)
    (spool / "tmpcrash.dcm").write_bytes(b"\0" * 1000)
    with GatewaySCP(config, lambda _study: None) as scp:
        assert scp.spool == spool and not any(spool.iterdir())


def test_install_refuses_a_pynetdicom_without_the_hooked_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install()  # the shipped pynetdicom: hooked
    assert dimse_messages.NamedTemporaryFile.__module__ == "radserve.gateway.receive_limit"
    monkeypatch.setattr(dimse_messages, "NamedTemporaryFile", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="NamedTemporaryFile"):
        install()


def test_a_connection_dropped_mid_instance_leaves_no_spool_file(tmp_path: Path) -> None:
    """pynetdicom leaves the partial temporary file of an unfinished C-STORE behind; the
    connection's end removes it. The peer sends a few P-DATA PDUs, then closes."""
    config = ScpConfig(
        data_dir=tmp_path / "gateway", port=0, allowed_peers=(Peer("STORESCU", "127.0.0.1"),)
    )
    ds = pydicom.dcmread(_bulky(small_study(tmp_path / "s")[0], tmp_path / "b.dcm", LIMIT))
    with GatewaySCP(config, lambda _study: None) as scp:
        ae = AE("STORESCU")
        ae.add_requested_context(CTImageStorage, ExplicitVRLittleEndian)
        assoc = ae.associate(*scp.address, ae_title="RADSERVE")
        assert assoc.is_established
        request = C_STORE()
        request.MessageID = 1
        request.AffectedSOPClassUID = CTImageStorage
        request.AffectedSOPInstanceUID = ds.SOPInstanceUID
        request.Priority = 2
        request.DataSet = BytesIO(encode(ds, False, True))
        message = C_STORE_RQ()
        message.primitive_to_message(request)
        context_id = assoc.accepted_contexts[0].context_id
        for count, primitive in enumerate(message.encode_msg(context_id, 16384)):
            if count == 20:
                break
            assoc.dul.send_pdu(primitive)
        assert wait_until(lambda: any(scp.spool.iterdir()), timeout=10)
        assoc.dul.socket.socket.shutdown(socket.SHUT_RDWR)
        assoc.kill()
        assert wait_until(lambda: not any(scp.spool.iterdir()), timeout=20)
        assert wait_until(lambda: not scp.admission.open_connections(), timeout=20)


ELEMENTS = 2000  # ingest.max_header_elements in the test below


def _crowded(source: Path, target: Path, count: int) -> Path:
    """``source`` with ``count`` private US elements (2 bytes each) and a planted name."""
    ds = pydicom.dcmread(source)
    ds.PatientName = PHI
    for block_number in range(0x10, 0x10 + count // 256 + 1):
        block = ds.private_block(0x0009, f"RADSERVE CROWD {block_number}", create=True)
        for offset in range(min(256, count)):
            block.add_new(offset, "US", offset)
        count -= 256
        if count <= 0:
            break
    ds.save_as(target, enforce_file_format=True)
    return target


def test_a_header_over_the_element_bound_is_refused_naming_the_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """C-STORE reads a received file's header by path: ingest.max_header_elements bounds
    that read as it bounds STOW-RS and discovery (pydicom read the path unbounded: the
    instance was stored, and its header built whole, whatever its element count). The
    association's other instances and a study sent at the same time are stored."""
    caplog.set_level(logging.INFO)
    studies: list[CompletedStudy] = []
    config = ScpConfig(
        data_dir=tmp_path / "gateway",
        port=0,
        quiet_s=1.0,
        max_header_elements=ELEMENTS,
        allowed_peers=(Peer("STORESCU", "127.0.0.1"),),
    )
    files = small_study(tmp_path / "hostile", seed=1)
    crowded = _crowded(files[5], tmp_path / "crowded.dcm", 3 * ELEMENTS)
    sent = [*files[:5], crowded, *files[6:]]
    good = small_study(tmp_path / "good", seed=2)
    with GatewaySCP(config, studies.append) as scp:
        beside = threading.Thread(target=lambda: runs.append(storescu(*scp.address, good)))
        runs: list[subprocess.CompletedProcess[str]] = []
        beside.start()
        hostile = storescu(*scp.address, sent, extra=["-v", "--no-halt"])  # past the failure
        beside.join()
        assert wait_until(lambda: len(studies) == 2, timeout=30)
    assert runs[0].returncode == 0, runs[0].stderr
    assert "Store Failed" in hostile.stderr or "Error" in hostile.stderr, hostile.stderr
    received = {s.study_instance_uid: s for s in studies}
    by_folder = {len(s.instances) for s in received.values()}
    assert by_folder == {len(files) - 1, len(good)}  # only the crowded instance refused
    names = {p.name for s in studies for p in s.instances}
    assert len(names) == len(files) - 1 + len(good)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert f"more than {ELEMENTS} data elements" in refusals[0]
    assert "ingest.max_header_elements" in refusals[0]
    assert PHI not in caplog.text and "Planted" not in caplog.text
    assert not any(r.exc_info for r in caplog.records)


def test_an_instance_that_would_eat_the_free_space_reserve_is_refused_while_it_arrives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # session 19: gateway.min_free_bytes was checked only when a received file was copied
    # into its study folder, so a data set of up to max_file_bytes (4 GiB) per
    # association filled the spool first (here the whole 24 MB, then 0xA700); 0a0a7d5
    # then aborted the association, which a PACS counts as a link fault. A reserve larger
    # than the disk: each data set is dropped from its first fragment (nothing past it is
    # written) and answered 0xA700 naming the reserve; the association goes on and ends
    # with a release, the next instance refused the same way
    caplog.set_level(logging.WARNING)
    config = ScpConfig(
        data_dir=tmp_path / "gateway",
        port=0,
        quiet_s=1.0,
        min_free_bytes=shutil.disk_usage(tmp_path).total,
        allowed_peers=(Peer("STORESCU", "127.0.0.1"),),
    )
    files = small_study(tmp_path / "study")
    bulky = _bulky(files[0], tmp_path / "bulky.dcm", 12 * LIMIT)
    studies: list[CompletedStudy] = []
    with GatewaySCP(config, studies.append) as scp:
        watch = _Watch(scp.spool)
        watch.start()
        try:
            run = storescu(*scp.address, [bulky, files[1]], extra=["-v", "--no-halt"])
        finally:
            watch.stop.set()
            watch.join()
        said_by_peer = run.stdout + run.stderr
        assert said_by_peer.count("Refused: OutOfResources") == 2, said_by_peer
        assert "Releasing Association" in said_by_peer, said_by_peer
        assert "Abort" not in said_by_peer, said_by_peer
        assert wait_until(lambda: not scp.admission.open_connections(), timeout=10)
        assert watch.largest[scp.spool] <= SPACE_CHECK_BYTES + 2 * config.max_pdu_bytes
        assert wait_until(lambda: not any(scp.spool.iterdir()), timeout=10)
    said = [r.getMessage() for r in caplog.records if "min_free_bytes" in r.getMessage()]
    assert len(said) == 2 and "STORESCU" in said[0] and "0xA700" in said[0]
    assert PHI not in " ".join(said)
    assert not studies
