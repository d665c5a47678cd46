"""The upload form's own-result filter reads each file's header within the ingest bound,
as every other door does: a Deflated file or a zip member holding a large private
element is not inflated or read whole into memory before ingest sees it."""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import DeflatedExplicitVRLittleEndian
from tests.factories.dicom_series import make_ct_series

from radserve.gateway.own_results import OwnResults
from radserve.service.own_uploads import without_own_results
from radserve.service.sniff import FileKind

BLOB = 160 * 2**20  # over the 64 MiB header bound, well under what would hide a regression
PEAK_LIMIT = 100 * 2**20


def _slice_with_blob(folder: Path, *, deflated: bool) -> bytes:
    path = make_ct_series(folder, n_slices=2)[0]
    ds = pydicom.dcmread(path)
    ds.add_new(0x00090010, "LO", "RADSERVE TEST")
    ds.add_new(0x00091000, "OB", bytes(BLOB))
    if deflated:
        ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=False)
    return out.getvalue()


def _zipped(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("slice.dcm", data)
    return out.getvalue()


@pytest.mark.parametrize("kind", [FileKind.DICOM, FileKind.ZIP])
def test_own_result_check_reads_a_bomb_within_the_header_bound(
    kind: FileKind, tmp_path: Path
) -> None:
    if kind is FileKind.DICOM:
        upload = _slice_with_blob(tmp_path, deflated=True)
    else:
        upload = _zipped(_slice_with_blob(tmp_path, deflated=False))
    assert len(upload) < BLOB // 100  # a bomb: small to send, large to read
    stream = io.BytesIO(upload)
    tracemalloc.start()
    try:
        with without_own_results([stream], [kind], OwnResults()) as kept:
            assert [name for name, _ in kept] == [f"upload{kind.suffix}"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.0f} MiB reading one upload's header"
