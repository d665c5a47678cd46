"""``gateway.receivers: 2``: dcmtk's storescu against several receiving processes behind
one port; every instance stored once, studies handed over once by the parent, a
receiving process killed right after its successes is replaced with nothing
acknowledged lost, and the receive limit's audit, the own-result index and the log
lines of a receiving process are the SCP process's."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import Intake, dcmtk_tool, loopback_scp_config, small_study, storescu
from tests.factories.waits import wait_until

from radserve.gateway import GatewaySCP
from radserve.gateway.completeness import INTERRUPTED_MARKER
from radserve.gateway.own_results import OwnResults
from radserve.gateway.receive_limit import Exceeded
from radserve.gateway.storage import partial_path, study_instances

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]

QUIET_S = 1.5


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[GatewaySCP, Intake]]:
    """Two receiving processes; a killed one's study waits for its sender (120 s)."""
    intake = Intake()
    config = loopback_scp_config(
        tmp_path / "gateway", QUIET_S, interrupted_quiet_s=120, receivers=2
    )
    with GatewaySCP(config, intake) as scp:
        yield scp, intake


def _uids(files: list[Path]) -> set[str]:
    return {str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in files}


def test_two_studies_over_concurrent_associations_are_stored_once_and_complete_once(
    gateway: tuple[GatewaySCP, Intake], tmp_path: Path
) -> None:
    scp, intake = gateway
    first = small_study(tmp_path / "a", seed=1, slices=range(10, 18))
    second = small_study(tmp_path / "b", seed=2, slices=range(10, 18))
    runs: list[int] = []
    senders = [
        threading.Thread(target=lambda f=files: runs.append(storescu(*scp.address, f).returncode))
        for files in (first, first[:3], second)  # first[:3] again: duplicates, kept once
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(120)
    assert runs == [0, 0, 0]
    assert wait_until(lambda: len(intake.studies) == 2, timeout=30)
    assert not wait_until(lambda: len(intake.studies) > 2, timeout=QUIET_S * 1.5)
    by_study = {s.study_instance_uid: s for s in intake.studies}
    for files in (first, second):
        uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
        study = by_study[uid]
        assert {p.stem for p in study.instances} == _uids(files)
        assert study.calling_ae_titles == ("STORESCU",)
    assert scp.admission.open_connections() == {}  # every slot given back by the children


def test_a_killed_receiver_is_replaced_and_loses_nothing_it_acknowledged(
    gateway: tuple[GatewaySCP, Intake], tmp_path: Path
) -> None:
    scp, intake = gateway
    pool = scp._pool
    assert pool is not None
    before = set(pool.pids())
    assert len(before) == 2
    files = small_study(tmp_path / "sent", slices=range(10, 18))
    ae = AE("PYNETDICOM")
    ae.add_requested_context(CTImageStorage, ["1.2.840.10008.1.2.1"])
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    assert assoc.is_established
    sent = [pydicom.dcmread(path) for path in files[:4]]
    statuses = [int(assoc.send_c_store(ds).Status) for ds in sent]
    assert statuses == [0, 0, 0, 0]
    # the receiving process running this association: the one whose slot is taken
    [victim] = [s.pid for s in pool._slots.values() if s.open]
    os.kill(victim, signal.SIGKILL)  # at once after the last success
    assert wait_until(lambda: not assoc.is_established, timeout=15)
    assert wait_until(lambda: len(pool.pids()) == 2 and victim not in pool.pids(), timeout=60)
    assert pool.restarts == 1
    assert scp.admission.open_connections() == {}
    folder = scp.instances.incoming / str(sent[0].StudyInstanceUID)
    assert (folder / INTERRUPTED_MARKER).exists()
    # the rest of the study, resent by the sender over a new association, to a new child
    assert storescu(*scp.address, files).returncode == 0
    assert wait_until(lambda: intake.studies, timeout=30)
    [study] = intake.studies
    assert {p.stem for p in study.instances} == _uids(files)
    assert not study.interrupted  # the resent association was released normally
    for ds in sent:
        again = pydicom.dcmread(folder / f"{ds.SOPInstanceUID}.dcm")
        assert again.PixelData == ds.PixelData
    assert len(study_instances(folder)) == len(files)


def test_a_receiver_killed_mid_c_store_leaves_no_partial_file_and_spares_the_live_ones(
    tmp_path: Path,
) -> None:
    """kill -9 of the receiving process while an instance's data set is arriving: its
    spool file and its temporary instance files go when it is replaced; the temporary
    files of the live processes (the other receiver, the parent) stay; the study stored
    before is intact."""
    intake = Intake()
    # 16 KiB PDUs: a large instance arrives slowly enough to be killed mid-way
    config = loopback_scp_config(
        tmp_path / "gateway", QUIET_S, receivers=2, advertised_pdu_bytes=16384
    )
    with GatewaySCP(config, intake) as scp:
        _kill_mid_c_store(scp, intake, tmp_path)


def _kill_mid_c_store(scp: GatewaySCP, intake: Intake, tmp_path: Path) -> None:
    pool = scp._pool
    assert pool is not None
    done = small_study(tmp_path / "done", seed=3, slices=range(10, 14))
    assert storescu(*scp.address, done).returncode == 0
    assert wait_until(lambda: intake.studies, timeout=30)
    kept = scp.instances.incoming / str(pydicom.dcmread(done[0]).StudyInstanceUID)
    before = {p.name: p.read_bytes() for p in study_instances(kept)}
    assert wait_until(lambda: not scp.admission.open_connections(), timeout=15)
    # a large instance, so that its data set is still arriving when the kill comes
    bulky = pydicom.dcmread(_padded(done[0], tmp_path / "bulky.dcm", 128 * 1024 * 1024))
    ae = AE("PYNETDICOM")
    ae.add_requested_context(CTImageStorage, ["1.2.840.10008.1.2.1"])
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    assert assoc.is_established
    sender = threading.Thread(target=lambda: assoc.send_c_store(bulky), daemon=True)
    sender.start()
    [victim] = [s for s in pool._slots.values() if s.open]
    [survivor] = [s.pid for s in pool._slots.values() if s is not victim]
    spool = scp.spool / f"receiver-{victim.index}"
    assert wait_until(lambda: _spooled_bytes(spool) > 0, timeout=30)
    # what it would leave had the kill come while its instance was being made durable,
    # beside what the live processes are writing now
    target = kept / "1.2.3.4.dcm"
    dead = partial_path(kept, target, pid=victim.pid)
    live = [partial_path(kept, target, pid=pid) for pid in (survivor, os.getpid())]
    for partial in (dead, *live):
        partial.write_bytes(b"half")
    os.kill(victim.pid, signal.SIGKILL)  # mid-C-STORE
    assert wait_until(lambda: len(pool.pids()) == 2 and victim.pid not in pool.pids(), 60)
    assert not dead.exists()
    assert all(p.exists() for p in live)
    assert not list(spool.glob("*.dcm"))
    assert {p.name: p.read_bytes() for p in study_instances(kept)} == before
    sender.join(30)
    assoc.abort()


def _spooled_bytes(spool: Path) -> int:
    """The bytes of the data sets arriving in a receiving process's spool folder."""
    total = 0
    for path in spool.glob("*.dcm"):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def _padded(source: Path, target: Path, size: int) -> Path:
    """``source`` as a new instance with a private element of ``size`` bytes."""
    ds = pydicom.dcmread(source)
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.add_new(0x00090010, "LO", "RADSERVE TEST")
    ds.add_new(0x00091010, "OB", b"\0" * size)
    ds.save_as(target, enforce_file_format=True)
    return target


def test_a_receiving_process_refuses_audits_and_filters_through_the_parent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The oversize audit, the result-index question and its count, and the log line
    of a receiving process all happen in the SCP process."""
    caplog.set_level(logging.INFO)
    files = small_study(tmp_path / "sent", slices=range(10, 14))
    known = {str(pydicom.dcmread(files[-1], stop_before_pixels=True).SOPInstanceUID)}
    refused: list[Exceeded] = []
    own = OwnResults(known=known.__contains__)
    limit = 256 * 1024
    config = loopback_scp_config(tmp_path / "gateway", 60, receivers=2, max_file_bytes=limit)
    with GatewaySCP(config, Intake(), own_results=own, on_oversize=refused.append) as scp:
        bulky = _padded(files[0], tmp_path / "bulky.dcm", 4 * limit)
        run = storescu(*scp.address, [bulky])
        assert run.returncode != 0 and "Peer aborted Association" in run.stderr
        assert wait_until(lambda: refused, timeout=15)
        assert (refused[0].calling_ae, refused[0].limit_bytes) == ("STORESCU", limit)
        assert storescu(*scp.address, files).returncode == 0  # the last one is radserve's
        assert wait_until(lambda: own.counts() == {"C-STORE": 1}, timeout=15)
        assert wait_until(lambda: not scp.admission.open_connections(), timeout=15)
        folder = scp.instances.incoming / str(pydicom.dcmread(files[0]).StudyInstanceUID)
        assert {p.stem for p in study_instances(folder)} == _uids(files) - known
    assert "aborted: a C-STORE data set passed" in caplog.text  # a child's record, here
    assert "radserve's own result (in the result index)" in caplog.text
