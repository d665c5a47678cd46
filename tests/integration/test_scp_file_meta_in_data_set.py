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
