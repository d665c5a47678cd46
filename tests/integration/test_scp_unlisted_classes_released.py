"""The private storage classes quarantine takes in are held per open association.

Under ``gateway.unwanted: quarantine`` the SCP registers each proposed private (or newer)
storage class with pynetdicom so that its objects can be received and kept aside: a PACS
whose one context is rejected may send none of the study (Orthanc 1.10.1 fails the whole
C-MOVE). The registry was capped at 256 classes per process and never given back, first
come first served: one peer's two associations proposing 128 made-up private UIDs each
filled it, and from then until a restart every association proposing Siemens CSA
Non-Image Storage (in most Siemens CT and MR studies) had that context rejected
(operator trial, 2026-12-07: "SOP class 1.3.12.2.1107.5.9.1 not accepted: 256 unlisted
classes taken in"). Now a class is held by the open associations that proposed it and
given back when the last of them closes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian
from pynetdicom import AE
from pynetdicom.association import Association
from tests.factories.dicom_net import edge_scp
from tests.factories.waits import wait_until

from radserve.gateway import GatewaySCP
from radserve.gateway import scp as scp_module

SIEMENS_CSA = "1.3.12.2.1107.5.9.1"  # Siemens CSA Non-Image Storage
MADE_UP_ROOT = "1.3.6.1.4.1.99999.77"


@pytest.fixture
def scp(tmp_path: Path) -> Iterator[GatewaySCP]:
    with edge_scp(tmp_path / "gateway") as server:
        yield server


def _associate(scp: GatewaySCP, classes: list[str]) -> Association:
    ae = AE("EDGE")
    ae.acse_timeout = ae.network_timeout = ae.dimse_timeout = 30
    for uid in classes:
        ae.add_requested_context(uid, ExplicitVRLittleEndian)
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    assert assoc.is_established
    return assoc


def _accepted(assoc: Association) -> set[str]:
    return {str(cx.abstract_syntax) for cx in assoc.accepted_contexts}


def _made_up(batch: int) -> list[str]:
    return [f"{MADE_UP_ROOT}.{batch}.{i + 1}" for i in range(128)]


def _private_object(sop_class: str) -> Dataset:
    ds = Dataset()
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = "1.2.826.0.1.3680043.8.498.77.1"
    ds.StudyInstanceUID = "1.2.826.0.1.3680043.8.498.77.2"
    ds.SeriesInstanceUID = "1.2.826.0.1.3680043.8.498.77.3"
    ds.Modality = "CT"
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return ds


def _held() -> set[str]:
    return {uid for uid in scp_module._registered if uid.startswith(MADE_UP_ROOT)}


def test_made_up_private_classes_do_not_lock_out_a_real_one(scp: GatewaySCP) -> None:
    for batch in range(4):  # 512 made-up classes, more than the old cap of 256
        assoc = _associate(scp, _made_up(batch))
        assert len(_accepted(assoc)) == 128
        assoc.release()
    # each given back once its association closed
    assert wait_until(lambda: not _held(), 10), len(_held())
    assoc = _associate(scp, [SIEMENS_CSA])
    try:
        assert SIEMENS_CSA in _accepted(assoc)  # before: rejected until a restart
        status = assoc.send_c_store(_private_object(SIEMENS_CSA))
        assert status.Status == 0, status
    finally:
        assoc.release()
    assert any(scp.instances.quarantine.rglob("*.dcm"))


def test_a_class_stays_registered_while_an_association_that_proposed_it_is_open(
    scp: GatewaySCP,
) -> None:
    shared = f"{MADE_UP_ROOT}.9.1"
    first = _associate(scp, [shared])
    second = _associate(scp, [shared])
    second.release()
    assert wait_until(lambda: second.is_released, 10)
    try:
        assert shared in _held()  # the first still holds it
        status = first.send_c_store(_private_object(shared))
        assert status.Status == 0, status
    finally:
        first.release()
    assert wait_until(lambda: shared not in _held(), 10)
