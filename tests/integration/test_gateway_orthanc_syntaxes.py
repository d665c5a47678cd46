"""What a real PACS sends when it holds a study in a transfer syntax radserve refuses:
Orthanc 1.10.1, pushing (``POST /modalities/radserve/store``) a study it stores in
Explicit VR Big Endian (retired) or 12-bit JPEG Extended (no decoder radserve may ship),
gets no presentation context for it and transcodes to Explicit VR Little Endian, so the
study arrives whole; the syntaxes radserve accepts arrive as stored. Skips without
Orthanc or dcmtk."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.pixels import apply_modality_lut
from tests.factories.dicom_net import Intake, Orthanc, dcmtk_tool, small_study
from tests.factories.dicom_series import dcmtk_compress
from tests.factories.waits import wait_until

from radserve.gateway import GatewaySCP, Peer, ScpConfig

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
    pytest.mark.skipif(dcmtk_tool("dcmconv") is None, reason="dcmtk is not installed"),
]
EXPLICIT = "1.2.840.10008.1.2.1"
# stored in Orthanc as -> arrives as; the largest difference allowed in HU (dcmcjpeg's
# 12-bit JPEG moves the stored values and the Rescale Intercept: compared after the LUT)
CASES = {
    "big-endian": ("1.2.840.10008.1.2.2", EXPLICIT, 0),
    "jpeg-extended": ("1.2.840.10008.1.2.4.51", EXPLICIT, 32),  # lossy 12-bit: 16 HU measured
    "jpeg-lossless": ("1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.57", 0),
    "jpeg-ls": ("1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.80", 0),
}


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Orthanc, Intake]]:
    root = tmp_path_factory.mktemp("orthanc-syntaxes")
    intake = Intake()
    config = ScpConfig(
        data_dir=root / "gateway",
        port=0,
        quiet_s=0.5,
        allowed_peers=(Peer("ORTHANC", "127.0.0.1"),),
    )
    with GatewaySCP(config, intake) as scp:
        orthanc = Orthanc(
            root / "orthanc", peers={"radserve": ["RADSERVE", "127.0.0.1", scp.address[1]]}
        )
        orthanc.start()
        try:
            yield orthanc, intake
        finally:
            orthanc.stop()


def _hu(ds: pydicom.Dataset) -> np.ndarray:
    return np.asarray(apply_modality_lut(ds.pixel_array, ds), dtype=float)


def _encode(files: list[Path], folder: Path, case: str) -> list[Path]:
    folder.mkdir()
    if case != "big-endian":
        return [dcmtk_compress(p, folder / p.name, case) for p in files]
    tool = dcmtk_tool("dcmconv")
    assert tool is not None
    for path in files:
        subprocess.run([tool, "+tb", str(path), str(folder / path.name)], check=True, timeout=60)
    return [folder / p.name for p in files]


@pytest.mark.parametrize("case", sorted(CASES))
def test_orthanc_sends_what_radserve_accepts(peers, tmp_path: Path, case: str) -> None:
    orthanc, intake = peers
    stored_as, arrives_as, tolerance = CASES[case]
    seed = sorted(CASES).index(case) + 1  # a study of its own (its own UIDs) per case
    original = small_study(tmp_path / "original", seed=seed, slices=range(10, 13))
    files = _encode(original, tmp_path / case, case)
    assert pydicom.dcmread(files[0]).file_meta.TransferSyntaxUID == stored_as
    intake.studies.clear()
    study_id = orthanc.upload(files)
    try:
        answer = orthanc.push("radserve", [study_id])
    finally:
        request = urllib.request.Request(f"{orthanc.url}/studies/{study_id}", method="DELETE")
        urllib.request.urlopen(request, timeout=10).close()
    assert answer["FailedInstancesCount"] == 0 and answer["InstancesCount"] == len(files)
    assert wait_until(lambda: intake.studies, timeout=15)
    [study] = intake.studies
    # lossy JPEG gets new SOP Instance UIDs from dcmcjpeg: pixels by the sent file's UID
    sent = {
        pydicom.dcmread(p).SOPInstanceUID: _hu(pydicom.dcmread(o))
        for p, o in zip(files, original, strict=True)
    }
    assert {p.stem for p in study.instances} == sent.keys()
    for path in study.instances:
        received = pydicom.dcmread(path)
        assert received.file_meta.TransferSyntaxUID == arrives_as
        difference = np.abs(_hu(received) - sent[path.stem])
        assert difference.max() <= tolerance, (path.stem, difference.max())
