"""A sender that delivers part of a study and keeps its association open (C-ECHOs as a
keep-alive, or silence short of the network timeout): the study is handed over after
``interrupted_quiet_s`` marked maybe-incomplete (``CompletedStudy.interrupted``, which
gives its job the ``study_maybe_incomplete`` warning), while the association is still
open. Before, it was handed over unmarked. pynetdicom on loopback against the SCP."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage, Verification
from tests.factories.dicom_net import Intake, loopback_scp_config, small_study
from tests.factories.waits import WAIT_SCALE

from radserve.gateway import GatewaySCP

QUIET_S = 0.5
OPEN_WAIT_S = 2.0  # gateway.interrupted_quiet_s: how long an open association holds it


@pytest.fixture
def scp(tmp_path: Path) -> Iterator[tuple[GatewaySCP, Intake]]:
    intake = Intake()
    config = loopback_scp_config(
        tmp_path / "gateway", QUIET_S, interrupted_quiet_s=OPEN_WAIT_S, network_timeout_s=120
    )
    with GatewaySCP(config, intake) as server:
        yield server, intake


def test_a_study_handed_over_while_its_sender_keeps_the_association_open_is_marked(
    scp: tuple[GatewaySCP, Intake], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server, intake = scp
    caplog.set_level(logging.WARNING)
    files = small_study(tmp_path / "study", slices=range(10, 16))
    ae = AE("PYNETDICOM")
    ae.add_requested_context(CTImageStorage)
    ae.add_requested_context(Verification)
    assoc = ae.associate(*server.address, ae_title="RADSERVE")
    assert assoc.is_established
    try:
        for path in files[:3]:  # 3 of 6 slices, then only keep-alives
            assert assoc.send_c_store(pydicom.dcmread(path)).Status == 0x0000
        deadline = time.monotonic() + (OPEN_WAIT_S + 10) * WAIT_SCALE
        while not intake.studies and time.monotonic() < deadline:
            assert assoc.send_c_echo().Status == 0x0000
            time.sleep(0.3)
        assert assoc.is_established  # handed over while the association is open
    finally:
        assoc.release()
    [study] = intake.studies
    assert len(study.instances) == 3
    assert study.interrupted  # the job carries study_maybe_incomplete
    assert any(
        "association(s) that delivered it are still open: it may be incomplete" in r.getMessage()
        for r in caplog.records
    )
