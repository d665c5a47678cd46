"""File Meta elements (group 0002) inside a C-STORE data set, as some senders send a
file's data set: the negotiated transfer syntax governs and the elements are removed
from the stored instance. Before, a stray Transfer Syntax UID of Explicit VR Big Endian
was obeyed, the data set read byte-swapped and the instance refused "Study Instance UID
missing". pynetdicom sends the data sets (it writes group 0002 elements of the data set
as they are) on an Explicit VR Little Endian or Implicit VR Little Endian context."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom.dataelem import DataElement
from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian, ImplicitVRLittleEndian
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import Intake, loopback_scp_config, small_study
from tests.factories.waits import until

from radserve.gateway import GatewaySCP

QUIET_S = 0.5


@pytest.fixture
def scp(tmp_path: Path) -> Iterator[tuple[GatewaySCP, Intake]]:
    intake = Intake()
    with GatewaySCP(loopback_scp_config(tmp_path / "gateway", QUIET_S), intake) as server:
        yield server, intake


def _with_stray_meta(path: Path) -> pydicom.Dataset:
    """The file's data set with its File Meta copied in, the Transfer Syntax UID made
    Big Endian and the Media Storage SOP Instance UID another instance's."""
    ds = pydicom.dcmread(path)
    for element in ds.file_meta:
        ds.add(DataElement(element.tag, element.VR, element.value))
    ds.add(DataElement(0x00020010, "UI", ExplicitVRBigEndian))
    ds.add(DataElement(0x00020003, "UI", "1.2.3.4.5.6.7.8.9"))
    return ds


@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ImplicitVRLittleEndian])
def test_file_meta_inside_the_data_set_is_removed_and_the_negotiated_syntax_governs(
    scp: tuple[GatewaySCP, Intake], tmp_path: Path, syntax: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, intake = scp
    caplog.set_level(logging.WARNING)
    files = small_study(tmp_path / "study", slices=range(10, 14))
    ae = AE("PYNETDICOM")
    ae.add_requested_context(CTImageStorage, syntax)
    assoc = ae.associate(*server.address, ae_title="RADSERVE")
    assert assoc.is_established
    try:
        statuses = [assoc.send_c_store(_with_stray_meta(p)) for p in files]
    finally:
        assoc.release()
    assert [(s.Status, s.get("ErrorComment")) for s in statuses] == [(0x0000, None)] * len(files)
    until(lambda: intake.studies, "the study handed over", 20)
    [study] = intake.studies
    assert len(study.instances) == len(files)
    sources = {str(s.SOPInstanceUID): s for s in map(pydicom.dcmread, files)}
    for stored in study.instances:
        ds = pydicom.dcmread(stored)
        assert ds.file_meta.TransferSyntaxUID == syntax
        assert ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID
        assert not [element.tag for element in ds if element.tag.group == 0x0002]
        source = sources[str(ds.SOPInstanceUID)]
        assert ds.StudyInstanceUID == source.StudyInstanceUID
        assert (ds.pixel_array == source.pixel_array).all()
    lines = [r.getMessage() for r in caplog.records if "File Meta elements" in r.getMessage()]
    assert len(lines) == 1  # once per association
    assert "instances from PYNETDICOM carry File Meta elements (group 0002)" in lines[0]


def test_stray_meta_elements_past_the_header_element_bound_are_not_skipped_one_by_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The skip over stray group 0002 elements obeys ``ingest.max_header_elements`` as
    every header read does: it walked up to ``max_header_bytes`` (64 MiB) of them one by
    one, 4,000,000 empty elements (32 MB) costing a receiving process 7.9 CPU-s per
    instance (operator trial, 2026-12-07), and stored what followed. Past the bound the
    file is left as it is, and the header read refuses it naming the setting."""
    caplog.set_level(logging.WARNING, logger="radserve.gateway.scp")
    config = loopback_scp_config(tmp_path / "gateway", QUIET_S, max_header_elements=2000)
    source = small_study(tmp_path / "study", slices=range(10, 11))[0]
    ds = pydicom.dcmread(source)
    for k in range(5000):  # (0002,1000)-(0002,2387): no File Meta keyword, each empty
        ds.add(DataElement(0x00021000 + k, "LO", ""))
    intake = Intake()
    with GatewaySCP(config, intake) as server:
        ae = AE("PYNETDICOM")
        ae.add_requested_context(CTImageStorage, ExplicitVRLittleEndian)
        assoc = ae.associate(*server.address, ae_title="RADSERVE")
        assert assoc.is_established
        try:
            status = assoc.send_c_store(ds)
        finally:
            assoc.release()
    assert status.Status == 0xC000, status  # before: 0x0000, the 5000 skipped and removed
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any("ingest.max_header_elements" in line for line in refusals), refusals


def test_remove_stray_meta_leaves_a_file_past_the_element_bound_as_it_is(tmp_path: Path) -> None:
    from radserve.gateway.stray_meta import remove_stray_meta

    meta = b"\x02\x00\x10\x00UI\x14\x00" + ExplicitVRLittleEndian.encode() + b"\x00"
    head = b"\x00" * 128 + b"DICM" + b"\x02\x00\x00\x00UL\x04\x00" + len(meta).to_bytes(4, "little")
    stray = b"\x02\x00\x99\x99LO\x00\x00" * 3000  # (0002,9999), empty, 3000 times
    path = tmp_path / "received.dcm"
    path.write_bytes(head + meta + stray + b"\x08\x00\x16\x00UI\x02\x001\x00")
    before = path.read_bytes()
    assert (
        remove_stray_meta(path, ExplicitVRLittleEndian, max_bytes=1 << 20, max_elements=2999) == 0
    )
    assert path.read_bytes() == before
    assert (
        remove_stray_meta(path, ExplicitVRLittleEndian, max_bytes=1 << 20, max_elements=3000)
        == 3000
    )
