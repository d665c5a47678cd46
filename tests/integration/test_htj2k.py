"""HTJ2K for real: phantom slices encoded by OpenJPH (ojph_compress), decoded by pydicom
through pylibjpeg-openjpeg; sent to the SCP in HTJ2K, stored byte for byte, and read by
ingest into the same volume as the uncompressed originals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import HTJ2K, HTJ2KLossless
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import small_study
from tests.factories.dicom_series import make_ct_series
from tests.factories.htj2k import CAP, OJPH_COMPRESS, SOC_SIZ, to_htj2k
from tests.factories.waits import wait_until

from radserve.gateway import CompletedStudy, GatewaySCP, Peer, ScpConfig
from radserve.gateway.conformance import SCP_TRANSFER_SYNTAXES, Status
from radserve.ingest import discover_series, load_series

pytestmark = pytest.mark.skipif(
    OJPH_COMPRESS is None, reason="ojph_compress is not installed (Debian: openjph-tools)"
)


def _codestream(path: Path) -> bytes:
    (frame,) = pydicom.encaps.generate_frames(pydicom.dcmread(path).PixelData, number_of_frames=1)
    return frame


@pytest.mark.parametrize("kind", ["phantom", "unsigned16", "signed16"])
def test_htj2k_lossless_slices_decode_to_the_same_pixels(tmp_path: Path, kind: str) -> None:
    """Signed data is tested with non-negative stored values only: OpenJPH 0.9 (the
    Debian encoder) writes negative samples in a form other decoders do not read back
    (OpenJPH issue #102, fixed upstream after 0.9); see docs/conformance.md."""
    if kind == "phantom":  # 12 bits stored, unsigned, as the phantom writer makes them
        sources = small_study(tmp_path / "src", slices=range(10, 13))
    else:
        sources = make_ct_series(
            tmp_path / "src", n_slices=3, rows=24, cols=20, bits_stored=16,
            signed=kind == "signed16", rescale=(1.0, -1024.0),
            hu=lambda p: -1000.0 + 30.0 * p[..., 0] ** 2,
        )  # fmt: skip
    for source in sources:
        encoded = to_htj2k(source, tmp_path / "htj2k" / source.name)
        codestream = _codestream(encoded)
        assert codestream.startswith(SOC_SIZ) and CAP in codestream[:256]  # a Part 15 stream
        back = pydicom.dcmread(encoded)
        assert back.file_meta.TransferSyntaxUID == HTJ2KLossless
        original = pydicom.dcmread(source).pixel_array
        assert back.pixel_array.dtype == original.dtype
        np.testing.assert_array_equal(back.pixel_array, original)


def test_htj2k_lossy_decodes_close_to_the_original(tmp_path: Path) -> None:
    (source,) = small_study(tmp_path / "src", slices=range(12, 13))
    encoded = to_htj2k(source, tmp_path / "lossy.dcm", lossless=False)
    back = pydicom.dcmread(encoded)
    assert back.file_meta.TransferSyntaxUID == HTJ2K
    error = np.abs(back.pixel_array.astype(float) - pydicom.dcmread(source).pixel_array)
    assert error.max() <= 8  # qstep 0.001 on 12-bit data


def test_an_htj2k_study_is_accepted_stored_as_sent_and_ingested(tmp_path: Path) -> None:
    assert HTJ2KLossless in SCP_TRANSFER_SYNTAXES and HTJ2K in SCP_TRANSFER_SYNTAXES
    sources = small_study(tmp_path / "src", slices=range(10, 16))
    sent = [to_htj2k(p, tmp_path / "htj2k" / p.name) for p in sources]
    handed: list[CompletedStudy] = []
    config = ScpConfig(
        data_dir=tmp_path / "gateway", port=0, quiet_s=0.5, allowed_peers=(Peer("PYNETDICOM"),)
    )
    with GatewaySCP(config, handed.append) as scp:
        ae = AE("PYNETDICOM")
        ae.add_requested_context(CTImageStorage, [HTJ2KLossless])  # HTJ2K only
        assoc = ae.associate(*scp.address, ae_title="RADSERVE")
        assert assoc.is_established
        try:
            for path in sent:
                assert int(assoc.send_c_store(str(path)).Status) == Status.SUCCESS
        finally:
            assoc.release()
        assert wait_until(lambda: handed, timeout=15)
    (study,) = handed
    assert len(study.instances) == len(sent)
    stored = {pydicom.dcmread(p).SOPInstanceUID: p for p in study.instances}
    for path in sent:
        ds = pydicom.dcmread(path)
        kept = pydicom.dcmread(stored[ds.SOPInstanceUID])
        assert kept.file_meta.TransferSyntaxUID == HTJ2KLossless
        assert kept.PixelData == ds.PixelData  # stored as received, not transcoded

    (header,) = discover_series(study.folder)
    (reference,) = discover_series(sources[0].parent)
    volume, expected = load_series(header).volume, load_series(reference).volume
    np.testing.assert_array_equal(volume.array, expected.array)
    np.testing.assert_allclose(volume.spacing, expected.spacing)
