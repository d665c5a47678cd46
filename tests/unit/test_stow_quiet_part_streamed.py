"""A STOW-RS part filed for the quiet period (``?complete=false``, or ``dicomweb.completeness:
quiet``) is copied to the gateway's folder in chunks, never read whole into memory.

Before (operator trial, 2026-12-07): ``StowIntake._file_for_quiet_period`` handed the
instance store ``part.read()``, so a part holding a large private element (which the
part checks skip unread) cost the server its size in memory: an 84 MB part peaked at
84 MB traced, and a part may be as large as ``server.max_upload_bytes`` (2 GiB), per
request. The instance store now takes a stream as it takes a file.
"""

from __future__ import annotations

import io
import tempfile
import tracemalloc
from pathlib import Path
from typing import BinaryIO

import pydicom
import pytest
from tests.factories.dicom_series import make_ct_series

from radserve.gateway.dicomweb.stow import StowIntake, StowPart
from radserve.gateway.storage import Disposition, InstanceStore

PRIVATE_BYTES = 48 << 20


def _part(source: Path, private_bytes: int, fill: int = 0) -> BinaryIO:
    """``source`` with a private OB element of ``private_bytes``, as the multipart parser
    holds a part: a spooled temporary file (on disk past 1 MiB)."""
    ds = pydicom.dcmread(source)
    block = ds.private_block(0x0011, "RADSERVE TRIAL", create=True)
    block.add_new(0x00, "OB", bytes([fill]) * private_bytes)
    encoded = io.BytesIO()
    ds.save_as(encoded, enforce_file_format=True)
    spool = tempfile.SpooledTemporaryFile(max_size=1 << 20)  # noqa: SIM115
    spool.write(encoded.getbuffer())
    spool.seek(0)
    return spool


def test_a_large_part_filed_for_the_quiet_period_is_not_read_into_memory(
    tmp_path: Path,
) -> None:
    source = make_ct_series(tmp_path / "series", n_slices=3, rows=16, cols=16)[0]
    stream = _part(source, PRIVATE_BYTES)
    intake: StowIntake[object] = StowIntake(
        lambda study: None, data_dir=tmp_path / "data", quiet_s=3600.0
    )
    tracemalloc.start()
    try:
        result = intake.store(
            [StowPart("application/dicom", stream)], target_study=None, submit=None, retry_after=1
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.stored == 1, result.instances
    # before: the part's 48 MB and more
    assert peak < 8 << 20, f"peak {peak >> 20} MiB traced while filing one part"
    stored = list((tmp_path / "data" / "dicomweb" / "incoming").glob("*/*.dcm"))
    assert len(stored) == 1
    stream.seek(0)
    with open(stored[0], "rb") as fh:
        while chunk := stream.read(1 << 20):
            assert fh.read(len(chunk)) == chunk
        assert fh.read(1) == b""


@pytest.mark.parametrize("durability", ["per_instance", "group"])
def test_the_store_takes_a_stream_as_it_takes_bytes(tmp_path: Path, durability: str) -> None:
    """The same dispositions for a stream as for its bytes: stored, a copy received again
    kept once, other content under the same UID kept beside (named by its content)."""
    source = make_ct_series(tmp_path / "series", n_slices=3, rows=16, cols=16)[0]
    store = InstanceStore(tmp_path / "store", durability=durability)  # type: ignore[arg-type]
    uids = {"study_instance_uid": "1.2.3", "sop_instance_uid": "1.2.3.4", "sop_class_uid": "1.2"}
    try:
        first = _part(source, 3 << 20)
        stored = store.save(first, **uids)
        assert stored.disposition is Disposition.STORED
        first.seek(0)
        assert stored.path.read_bytes() == first.read()
        again = store.save(_part(source, 3 << 20), **uids)
        assert again.disposition is Disposition.DUPLICATE
        assert again.path == stored.path
        other = _part(source, 3 << 20, fill=1)
        beside = store.save(other, **uids)
        assert beside.disposition is Disposition.STORED
        assert beside.path != stored.path
        other.seek(0)
        assert beside.path.read_bytes() == other.read()
        # and as bytes, the content found already stored
        other.seek(0)
        assert store.save(other.read(), **uids).disposition is Disposition.DUPLICATE
    finally:
        store.close()
