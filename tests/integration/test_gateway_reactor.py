"""Each association's two threads block instead of polling (radserve.gateway.reactor),
and what the receive path shares between associations stays as it was: real pynetdicom
and dcmtk peers on loopback."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pynetdicom import AE
from pynetdicom.dul import DULServiceProvider
from pynetdicom.pdu import A_ASSOCIATE_RQ, A_RELEASE_RQ, P_DATA_TF
from pynetdicom.sop_class import CTImageStorage, Verification
from tests.factories.dicom_net import Intake, dcmtk_tool, loopback_scp_config, small_study, storescu
from tests.factories.waits import wait_until

from radserve.gateway import GatewaySCP, reactor
from radserve.gateway.conformance import Status

pytestmark = pytest.mark.tools


@pytest.fixture
def scp(tmp_path: Path) -> Iterator[GatewaySCP]:
    with GatewaySCP(loopback_scp_config(tmp_path / "gateway", 1.5), Intake()) as server:
        yield server


def _associate(scp: GatewaySCP, *contexts: tuple[str, list[str]]):
    ae = AE("PYNETDICOM")
    for sop_class, syntaxes in contexts or ((Verification, ["1.2.840.10008.1.2"]),):
        ae.add_requested_context(sop_class, syntaxes)
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    assert assoc.is_established
    return assoc


def test_idle_associations_wake_their_threads_rarely(scp: GatewaySCP, monkeypatch) -> None:
    """pynetdicom's reactors look every ~1 ms (~1,000 wake-ups a second each thread);
    here an idle association's threads wake once per POLL_S at most, and still answer."""
    wakes: Counter[str] = Counter()
    lock = threading.Lock()
    dul_wait, get_msg = reactor._WaitingDUL._wait, reactor._WaitingDIMSE.get_msg

    def counted(name, real):
        def wrapper(self, *args, **kwargs):
            with lock:
                wakes[name] += 1
            return real(self, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(reactor._WaitingDUL, "_wait", counted("dul", dul_wait))
    monkeypatch.setattr(reactor._WaitingDIMSE, "get_msg", counted("association", get_msg))
    assocs = [_associate(scp) for _ in range(2)]
    try:
        with lock:
            wakes.clear()
        start = time.monotonic()
        time.sleep(1.0)
        with lock:
            counted_wakes = dict(wakes)
        idle_s = time.monotonic() - start
        most = len(assocs) * (2 * idle_s / reactor.POLL_S + 5)  # twice the period: margin
        assert 0 < counted_wakes["dul"] <= most, counted_wakes
        assert 0 < counted_wakes["association"] <= most, counted_wakes
        for assoc in assocs:
            assert int(assoc.send_c_echo().Status) == Status.SUCCESS
    finally:
        for assoc in assocs:
            assoc.release()


def test_associations_leave_no_descriptor_behind(scp: GatewaySCP) -> None:
    """Each association's wake-up pipe is closed when it ends (released or aborted)."""
    _associate(scp).release()  # anything opened once per process, opened now
    assert wait_until(lambda: len(scp.admission.open_connections()) == 0, timeout=10)
    before = len(os.listdir("/proc/self/fd"))
    for k in range(6):
        assoc = _associate(scp)
        if k % 2:
            assoc.abort()
        else:
            assoc.release()
    assert wait_until(lambda: len(scp.admission.open_connections()) == 0, timeout=10)
    assert wait_until(lambda: len(os.listdir("/proc/self/fd")) <= before, timeout=10)


def test_each_received_pdu_is_converted_once_and_its_threads_cpu_counted(
    scp: GatewaySCP, monkeypatch
) -> None:
    """The SCP checks that a PDU converts to a primitive as it decodes it (a bad one is an
    invalid PDU there); the state machine then gets that primitive instead of converting
    again (a 128-context A-ASSOCIATE-RQ: ~1.5 CPU-ms). The DUL thread's CPU reaches the
    ledger when the association ends."""
    converted: list[object] = []  # the PDUs themselves: their ids stay unique
    for pdu_class in (A_ASSOCIATE_RQ, P_DATA_TF, A_RELEASE_RQ):
        real = pdu_class.__dict__["to_primitive"]  # a method or a staticmethod

        def counted(self, real=real):
            converted.append(self)
            return real.__get__(self, type(self))()

        monkeypatch.setattr(pdu_class, "to_primitive", counted)
    assoc = _associate(scp)
    assert int(assoc.send_c_echo().Status) == Status.SUCCESS
    assoc.release()
    assert assoc.is_released
    assert wait_until(lambda: len(scp.admission.open_connections()) == 0, timeout=10)
    # received by the SCP: the request, the echo's P-DATA and the release request; by
    # this test's requestor: the echo response's P-DATA
    pdus = {id(pdu): pdu for pdu in converted}
    kinds = sorted(type(pdu).__name__ for pdu in pdus.values())
    assert kinds == ["A_ASSOCIATE_RQ", "A_RELEASE_RQ", "P_DATA_TF", "P_DATA_TF"]
    assert len(converted) == len(pdus)  # none twice
    assert wait_until(lambda: scp.cpu.snapshot()["receive"] > 0, timeout=10)


def _snapshot(contexts) -> list[tuple]:
    return [(c.abstract_syntax, tuple(c.transfer_syntax), c.scu_role, c.scp_role) for c in contexts]


@pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed")
def test_associations_share_the_servers_contexts_unchanged(scp: GatewaySCP, tmp_path: Path) -> None:
    """pynetdicom deep-copied the server's 171 contexts for every association; they are
    shared now, so no negotiation may change them: peers proposing different transfer
    syntaxes, one after another, each get theirs, and the contexts stay as they were."""
    server = scp._server
    assert server is not None
    before = _snapshot(server.contexts)
    for syntax in ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1"):
        assoc = _associate(scp, (CTImageStorage, [syntax]))
        try:
            [accepted] = assoc.accepted_contexts
            assert accepted.transfer_syntax == [syntax]
        finally:
            assoc.release()
    files = small_study(tmp_path / "sent", slices=range(10, 12))
    assert storescu(*scp.address, files).returncode == 0
    assert _snapshot(server.contexts) == before


def test_a_pynetdicom_without_the_replaced_internals_is_refused(monkeypatch) -> None:
    monkeypatch.delattr(DULServiceProvider, "_process_recv_primitive")
    with pytest.raises(RuntimeError, match="_process_recv_primitive"):
        reactor.check()
