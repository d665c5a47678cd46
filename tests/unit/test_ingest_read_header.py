"""ingest.headers.read_header: the one DICOM header parser for code outside ingest
(STOW-RS checks, priority attributes, result index, WADO-RS metadata, FHIR)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import DeflatedExplicitVRLittleEndian, ExplicitVRLittleEndian, generate_uid

from radserve.errors import NotDicomError
from radserve.ingest.headers import DEFER_BYTES, UnreadableHeaderError, read_header

_BIG_PRIVATE = 0x00091010


def _part10(tmp_path: Path, *, big: int = 0) -> Path:
    ds = Dataset()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    ds.SOPInstanceUID = generate_uid()
    ds.StudyInstanceUID = generate_uid()
    ds.PatientName = "Doe^Jane"
    ds.add_new(0x00090010, "LO", "HOSTILE")
    if big:
        ds.add_new(_BIG_PRIVATE, "OB", b"\x00" * big)
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    path = tmp_path / "one.dcm"
    ds.save_as(path, enforce_file_format=True)
    return path


def test_large_elements_are_deferred_until_used(tmp_path: Path) -> None:
    size = 4 * DEFER_BYTES
    path = _part10(tmp_path, big=size)
    header = read_header(path)
    # rewrite the large value on disk after parsing: what the header then holds was
    # read on use, not while parsing
    data = path.read_bytes()
    at = data.rindex(b"\x00" * size)
    path.write_bytes(data[:at] + b"\x01" * size + data[at + size :])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom notes the changed modification time
        assert header[_BIG_PRIVATE].value == b"\x01" * size
    assert str(header.PatientName) == "Doe^Jane"


def test_only_the_requested_tags_are_read(tmp_path: Path) -> None:
    header = read_header(_part10(tmp_path), tags=["SOPInstanceUID"])
    assert "SOPInstanceUID" in header
    assert "PatientName" not in header


def test_a_stream_is_read_like_a_file(tmp_path: Path) -> None:
    path = _part10(tmp_path)
    from_stream = read_header(io.BytesIO(path.read_bytes()))
    assert from_stream.to_json_dict() == read_header(path).to_json_dict()


@pytest.mark.parametrize(
    "content",
    [b"", b"not dicom at all" * 20],
    ids=["empty", "text"],
)
def test_unreadable_input_is_a_not_dicom_error_naming_only_the_cause(content: bytes) -> None:
    with pytest.raises(UnreadableHeaderError, match=r"unreadable DICOM header \(\w+\)") as info:
        read_header(io.BytesIO(content))
    assert isinstance(info.value, NotDicomError)
    assert info.value.cause_name in info.value.message


def test_a_missing_file_is_an_os_error_not_a_header_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        read_header(tmp_path / "gone.dcm")


def test_a_stream_is_read_within_the_header_bound(tmp_path: Path) -> None:
    data = _part10(tmp_path).read_bytes()
    # the bound is ours: the reason names it (session 18; was the bare type name)
    bound = r"\(InputTooLargeError: reading would need .* more than ingest.max_header_bytes=64\)"
    with pytest.raises(UnreadableHeaderError, match=bound):
        read_header(io.BytesIO(data), max_header_bytes=64)
    assert read_header(io.BytesIO(data)).PatientName == "Doe^Jane"  # the default bound


def _deflated(tmp_path: Path, big: int) -> Path:
    path = _part10(tmp_path, big=big)
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    ds.save_as(path, enforce_file_format=True)
    return path


def _peak_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmHWM:")).split()[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux peak RSS reset")
def test_a_deflated_header_is_inflated_only_within_the_bound(tmp_path: Path) -> None:
    """pydicom inflates a Deflated data set whole, in memory (a 2 MB file inflating to
    256 MB took the server up by 500 MB); read_header inflates only as far as it
    reads, at most max_header_bytes, from a path and from a stream alike."""
    path = _deflated(tmp_path, big=128 * 2**20)
    assert path.stat().st_size < 2**20
    for source in (path, io.BytesIO(path.read_bytes())):
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := RSS now
        before = _peak_mb()
        with pytest.raises(UnreadableHeaderError, match="InputTooLargeError"):
            read_header(source, max_header_bytes=4 * 2**20)
        assert _peak_mb() - before < 32  # the 128 MB element never inflated


def test_a_deflated_header_reads_like_any_other(tmp_path: Path) -> None:
    path = _deflated(tmp_path, big=1000)
    for source in (path, io.BytesIO(path.read_bytes())):
        ds = read_header(source)
        assert str(ds.PatientName) == "Doe^Jane" and ds[_BIG_PRIVATE].value == b"\x00" * 1000
        assert ds.file_meta.TransferSyntaxUID == DeflatedExplicitVRLittleEndian  # as stored
        assert "PixelData" not in ds
    ds = read_header(path, tags=["StudyInstanceUID"])
    assert ds.StudyInstanceUID and "PatientName" not in ds


@pytest.mark.parametrize(
    "syntax", [ExplicitVRLittleEndian, DeflatedExplicitVRLittleEndian], ids=["explicit", "deflated"]
)
def test_a_known_transfer_syntax_reads_what_the_file_meta_would_say(
    tmp_path: Path, syntax: str
) -> None:
    """The C-STORE SCP passes the presentation context's syntax (pynetdicom wrote the
    file's meta from it): the header read is the one a parse of the meta would give."""
    path = _deflated(tmp_path, big=1000) if syntax == DeflatedExplicitVRLittleEndian else None
    path = path or _part10(tmp_path, big=1000)
    known = read_header(path, transfer_syntax=syntax)
    assert known.to_json_dict() == read_header(path).to_json_dict()
    assert known.file_meta.TransferSyntaxUID == syntax and str(known.PatientName) == "Doe^Jane"


def _many_elements(tmp_path: Path, count: int, *, deflated: bool = False) -> Path:
    path = _deflated(tmp_path, big=10) if deflated else _part10(tmp_path)
    ds = pydicom.dcmread(path)
    for i in range(count):  # private elements of group 0009, block 0x10
        ds.add_new(0x00091000 | (0x1000 + i) & 0xFFFF, "US", i)
    ds.save_as(path, enforce_file_format=True)
    return path


@pytest.mark.parametrize("source", ["path", "stream", "deflated"])
def test_every_source_is_read_within_the_element_bound(tmp_path: Path, source: str) -> None:
    """One bound whatever the door: a path (C-STORE's received file, a stored file) was
    read by pydicom unbounded, so ingest.max_header_elements did not apply to it."""
    path = _many_elements(tmp_path, 200, deflated=source == "deflated")
    read = io.BytesIO(path.read_bytes()) if source == "stream" else path
    bound = r"\(InputTooLargeError: the header holds more than 100 data elements, more than "
    bound += "ingest.max_header_elements"
    with pytest.raises(UnreadableHeaderError, match=bound):
        read_header(read, max_header_elements=100)
    if source == "stream":
        read.seek(0)
    assert str(read_header(read, max_header_elements=1000).PatientName) == "Doe^Jane"


def test_a_path_is_left_closed_and_read_again_for_deferred_values(tmp_path: Path) -> None:
    import gc
    import os

    path = _part10(tmp_path, big=2 * DEFER_BYTES)
    gc.collect()  # what earlier tests left for the collector closes its files now, not below
    fds = len(os.listdir("/proc/self/fd"))
    header = read_header(path)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds  # no file held open by the header
    assert header.filename == str(path) and header[_BIG_PRIVATE].value == b"\x00" * 2 * DEFER_BYTES


def test_result_writing_reads_source_headers_without_their_large_values(tmp_path: Path) -> None:
    """The SEG/SR writer read every source header whole (pydicom.dcmread): a slice's
    50 MB value was held while the results were written. It reads them as read_header
    does: a large value is read when used."""
    import tracemalloc

    from radserve.report.dicom.common import read_headers

    size = 16 * 2**20
    path = _part10(tmp_path, big=size)
    tracemalloc.start()
    try:
        headers = read_headers([path])
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert held < size // 4
    assert headers[0][_BIG_PRIVATE].value == b"\x00" * size  # read on use


def test_result_writing_reads_source_headers_within_the_site_s_bounds(tmp_path: Path) -> None:
    """The SEG/SR writer read its sources under the default bounds whatever the site set:
    with ``ingest.max_header_elements`` raised, a study ingest accepted had its results
    refused after the models ran. It takes the policy ingest read the study under."""
    from radserve.errors import ReportError
    from radserve.ingest.policy import IngestPolicy
    from radserve.report.dicom.common import read_headers

    path = _many_elements(tmp_path, 200, deflated=False)
    with pytest.raises(ReportError, match="UnreadableHeaderError"):
        read_headers([path], IngestPolicy(max_header_elements=100))
    [header] = read_headers([path], IngestPolicy(max_header_elements=1000))
    assert str(header.PatientName) == "Doe^Jane"
