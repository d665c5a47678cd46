"""The SCP acknowledges radserve's own results and never files them as input, under both
unwanted-object policies; anyone else's SEG/SR follows the policy (pynetdicom as the
sending PACS, dcmtk storescu for the images)."""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import generate_uid
from pynetdicom import AE
from pynetdicom.sop_class import Comprehensive3DSRStorage, CTImageStorage
from tests.factories.dicom_net import dcmtk_tool, small_study, storescu

from radserve.gateway import GatewaySCP, ScpConfig, UnwantedPolicy
from radserve.gateway.conformance import Status

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]


def _store(address: tuple[str, int], paths: list[Path]) -> list[int]:
    ae = AE("PACS")
    for sop_class in (CTImageStorage, Comprehensive3DSRStorage):
        ae.add_requested_context(sop_class, ["1.2.840.10008.1.2.1"])
    assoc = ae.associate(*address, ae_title="RADSERVE")
    assert assoc.is_established
    try:
        return [int(assoc.send_c_store(str(path)).Status) for path in paths]
    finally:
        assoc.release()


def _sr(folder: Path, study_uid: str, manufacturer: str) -> Path:
    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = Comprehensive3DSRStorage, generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.Modality = study_uid, generate_uid(), "SR"
    ds.Manufacturer = manufacturer
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
    path = folder / f"sr-{manufacturer}.dcm"
    ds.save_as(path, enforce_file_format=True)
    return path


def _key_image(source: Path, folder: Path) -> Path:
    """An image with radserve named in its Contributing Equipment (as its key images)."""
    ds = pydicom.dcmread(source)
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    item = Dataset()
    item.Manufacturer = "radserve"
    ds.ContributingEquipmentSequence = [item]
    path = folder / "key-image.dcm"
    ds.save_as(path, enforce_file_format=True)
    return path


@pytest.mark.parametrize("policy", list(UnwantedPolicy))
def test_own_results_are_acknowledged_and_never_filed(tmp_path: Path, policy) -> None:
    studied: list[object] = []
    files = small_study(tmp_path / "study", slices=range(10, 13))
    study_uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    own = [_sr(tmp_path, study_uid, "radserve"), _key_image(files[0], tmp_path)]
    foreign = _sr(tmp_path, study_uid, "OTHER VENDOR")
    config = ScpConfig(data_dir=tmp_path / "gw", port=0, quiet_s=30, unwanted=policy)
    with GatewaySCP(config, studied.append) as server:
        assert storescu(*server.address, files).returncode == 0
        assert _store(server.address, own) == [Status.SUCCESS, Status.SUCCESS]
        expected = (
            Status.SUCCESS
            if policy is UnwantedPolicy.QUARANTINE
            else Status.SOP_CLASS_NOT_SUPPORTED
        )
        assert _store(server.address, [foreign]) == [expected]
        filed = sorted(p.stem for p in (server.instances.incoming / study_uid).glob("*.dcm"))
        quarantined = list(server.instances.quarantine.glob("*/*.dcm"))
        assert server.own_results.counts() == {"C-STORE": 2}
    sources = sorted(str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in files)
    assert filed == sources  # the key image was not filed among the study's images
    assert [p.stem for p in quarantined] == (
        [str(pydicom.dcmread(foreign).SOPInstanceUID)]
        if policy is UnwantedPolicy.QUARANTINE
        else []
    )
    assert studied == []  # nothing was handed over (quiet period not yet over)
