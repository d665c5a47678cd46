"""Compressed pixel data that is not what its header says, refused before a decoder reads
it (2026-12-07 probe of a running ``radserve serve``, docs/hostile-input.md "Frames,
tables and bombs"): a frame whose codestream declares another image than Rows x Columns
(a JPEG-LS one of fewer pixels aborted the server; one of more, or of another shape, ran
on pixels that are not the image; a 1 KB JPEG 2000 one of 16384 x 16384 pixels took 2.2
GB), offset tables that do not point at the fragments in order (an Extended Offset Table
with two entries swapped ran, the slices swapped), an RLE segment decoding past the frame
(a Rust panic passed `except Exception` and hung the job), a Deflated file inflating far
beyond what its header declares, a zip member in a compression zipfile cannot read."""

from __future__ import annotations

import io
import re
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.encaps import encapsulate, encapsulate_extended, generate_frames
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset, write_file_meta_info
from pydicom.pixels.encoders import RLELosslessEncoder
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLSLossless,
    RLELossless,
)
from tests.factories.dicom_series import make_ct_series, make_enhanced_series, ramp_hu

from radserve.errors import DecodeError, StudyError
from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.ingest.decode import decode_stack, shutdown_decode_workers
from radserve.ingest.sources import SourceReader
from radserve.ingest.validate import InstanceError

ROWS, COLS = 40, 36


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():  # type: ignore[no-untyped-def]
    yield
    shutdown_decode_workers()


def _series(folder: Path, syntax: str, rows: int = ROWS, cols: int = COLS) -> list[Path]:
    return make_ct_series(folder, n_slices=4, rows=rows, cols=cols, transfer_syntax=syntax)


def _frame(path: Path) -> bytes:
    ds = pydicom.dcmread(path)
    return next(generate_frames(ds.PixelData, number_of_frames=1))


def _put_frame(path: Path, frame: bytes) -> None:
    ds = pydicom.dcmread(path)
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds.save_as(path)


@pytest.mark.parametrize(
    ("syntax", "shape", "codec"),
    [
        (JPEGLSLossless, (20, 18), "JPEG-LS"),  # fewer pixels: GDCM aborted the process
        (JPEGLSLossless, (64, 64), "JPEG-LS"),  # more: cut to Rows x Columns, ran
        (JPEGLSLossless, (18, 80), "JPEG-LS"),  # as many, another shape: ran
        (JPEG2000Lossless, (32, 45), "JPEG 2000"),  # as many, another shape: ran
        (JPEG2000Lossless, (2048, 2048), "JPEG 2000"),  # a bomb (the probe's: 16384²)
    ],
)
def test_a_frame_declaring_another_image_is_refused_before_it_is_decoded(
    tmp_path: Path, syntax: str, shape: tuple[int, int], codec: str
) -> None:
    paths = _series(tmp_path / "study", syntax)
    other = make_ct_series(
        tmp_path / "other", n_slices=1, rows=shape[0], cols=shape[1], transfer_syntax=syntax
    )
    _put_frame(paths[1], _frame(other[0]))
    header = discover_series(tmp_path / "study")[0]
    odd = next(f for f in header.frames if f.source.path == paths[1])
    assert odd.problem is not None and odd.problem.code == "instance_invalid", odd.problem
    assert (
        f"its {codec} codestream declares {shape[0]} × {shape[1]} pixels of 1 component(s)"
        in odd.problem.text
    )
    assert f"Rows × Columns × Samples per Pixel say {ROWS} × {COLS} × 1" in odd.problem.text
    with pytest.raises(InstanceError, match="the pixel data is not the image the header"):
        load_series(header)


def test_frames_that_are_the_image_their_header_describes_load(tmp_path: Path) -> None:
    hu = ramp_hu(4, ROWS, COLS)
    for syntax in (JPEGLSLossless, JPEG2000Lossless, RLELossless):
        folder = tmp_path / syntax
        make_ct_series(folder, n_slices=4, rows=ROWS, cols=COLS, hu=hu, transfer_syntax=syntax)
        header = discover_series(folder)[0]
        assert all(f.problem is None for f in header.frames)
        assert np.array_equal(load_series(header).volume.array, hu.astype(np.int16))


def test_an_rle_frame_of_other_samples_is_refused_by_its_segment_count(tmp_path: Path) -> None:
    paths = _series(tmp_path / "study", RLELossless)
    colour = np.zeros((ROWS, COLS, 3), np.uint8)  # three 8-bit samples: three segments
    frame = RLELosslessEncoder.encode(
        colour,
        rows=ROWS,
        columns=COLS,
        samples_per_pixel=3,
        bits_allocated=8,
        bits_stored=8,
        pixel_representation=0,
        photometric_interpretation="RGB",
        planar_configuration=0,
        number_of_frames=1,
    )
    _put_frame(paths[0], frame)
    header = discover_series(tmp_path / "study")[0]
    odd = next(f for f in header.frames if f.source.path == paths[0])
    assert odd.problem is not None and odd.problem.code == "instance_invalid"
    assert "its RLE header lists 3 segments, but Samples per Pixel" in odd.problem.text


@pytest.mark.parametrize("processes", [False, True])
def test_a_decoder_panic_is_a_decoding_failure(tmp_path: Path, processes: bool) -> None:
    """pylibjpeg-rle panics (a Rust PanicException, a BaseException) on a segment that
    decodes past Rows x Columns: it ended the scheduler's worker thread, the job ran for
    ever and every later job queued behind it."""
    paths = _series(tmp_path / "study", RLELossless)
    bigger = make_ct_series(
        tmp_path / "big", n_slices=1, rows=64, cols=64, transfer_syntax=RLELossless
    )
    _put_frame(paths[2], _frame(bigger[0]))  # two segments, as the header expects
    header = discover_series(tmp_path / "study")[0]
    assert all(f.problem is None for f in header.frames)  # only decoding can tell
    with pytest.raises(DecodeError, match="RLE Lossless"), SourceReader() as reader:
        decode_stack(header.frames, reader, air=-1024.0, processes=processes)


def _enhanced_rle(folder: Path) -> tuple[Path, list[bytes]]:
    path = make_enhanced_series(
        folder, n_frames=6, rows=ROWS, cols=COLS, transfer_syntax=RLELossless
    )
    ds = pydicom.dcmread(path)
    return path, list(generate_frames(ds.PixelData, number_of_frames=6))


def _with_pixel_data(path: Path, data: bytes, **elements: bytes) -> None:
    ds = pydicom.dcmread(path)
    ds.PixelData = data
    ds["PixelData"].VR = "OB"
    for keyword, value in elements.items():
        setattr(ds, keyword, value)
    ds.save_as(path)


def test_an_extended_offset_table_out_of_order_is_refused(tmp_path: Path) -> None:
    """Two entries swapped (offsets and lengths alike): the two frames were read in each
    other's place and the study ran."""
    path, frames = _enhanced_rle(tmp_path / "eot")
    data, offsets, lengths = encapsulate_extended(frames)
    table = list(struct.unpack("<6Q", offsets))
    sizes = list(struct.unpack("<6Q", lengths))
    table[0], table[1], sizes[0], sizes[1] = table[1], table[0], sizes[1], sizes[0]
    _with_pixel_data(
        path,
        data,
        ExtendedOffsetTable=struct.pack("<6Q", *table),
        ExtendedOffsetTableLengths=struct.pack("<6Q", *sizes),
    )
    frame = discover_series(tmp_path / "eot")[0].frames[0]
    assert frame.problem is not None and frame.problem.code == "decode_failed"
    assert "Extended Offset Table's offsets do not ascend" in frame.problem.text


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda t: [t[0], t[1] + 10, *t[2:]], "entry for frame 2 points at no fragment"),
        (lambda t: [t[1], t[0], *t[2:]], "offsets do not ascend from the first fragment"),
    ],
)
def test_a_basic_offset_table_that_does_not_point_at_the_fragments_is_refused(
    tmp_path: Path, edit: object, said: str
) -> None:
    path, frames = _enhanced_rle(tmp_path / "bot")
    data = bytearray(encapsulate(frames, has_bot=True))
    table = edit(list(struct.unpack("<6L", data[8:32])))  # type: ignore[operator]
    data[8:32] = struct.pack("<6L", *table)
    _with_pixel_data(path, bytes(data))
    frame = discover_series(tmp_path / "bot")[0].frames[0]
    assert frame.problem is not None and frame.problem.code == "decode_failed"
    assert f"the Basic Offset Table's {said}" in frame.problem.text


def _deflated(source: Path, target: Path, zeros_after_pixels: int) -> None:
    """``source`` as Deflated Explicit VR Little Endian, with a private OB element of
    ``zeros_after_pixels`` zeros after its Pixel Data (deflate shrinks it ~1000 times)."""
    ds = pydicom.dcmread(source)
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    body = DicomBytesIO()
    body.is_little_endian, body.is_implicit_VR = True, False
    write_dataset(body, ds)
    creator = struct.pack("<HH2sH", 0x7FE1, 0x0010, b"LO", 6) + b"BOMB  "
    element = struct.pack("<HH2sHL", 0x7FE1, 0x1010, b"OB", 0, zeros_after_pixels)
    meta = DicomBytesIO()
    meta.is_little_endian, meta.is_implicit_VR = True, False
    write_file_meta_info(meta, ds.file_meta)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    with open(target, "wb") as out:
        out.write(b"\0" * 128 + b"DICM" + meta.getvalue())
        out.write(deflate.compress(body.getvalue() + creator + element))
        for _ in range(zeros_after_pixels // 2**20):
            out.write(deflate.compress(bytes(2**20)))
        out.write(deflate.flush())


def test_a_deflated_file_inflating_beyond_what_its_header_declares_is_refused(
    tmp_path: Path,
) -> None:
    """1 MB inflating to 1 GiB after 3 KB of pixels took 35 s and 1 GiB of the temporary
    folder (at discovery, and again at decoding) and ran: radserve inflated up to
    ingest.max_file_bytes (4 GiB) of any file. Here with a 1 MiB header bound, 8 MiB."""
    policy = IngestPolicy(max_header_bytes=2**20)
    paths = _series(tmp_path / "study", "1.2.840.10008.1.2.1")
    _deflated(paths[1], paths[1], 8 * 2**20)
    _deflated(paths[2], paths[2], 2**19)  # within the bound: read, as before
    assert paths[1].stat().st_size < 64 * 1024
    header = discover_series(tmp_path / "study", policy=policy)[0]
    assert [s.source.path for s in header.skipped] == [paths[1]]
    reason = header.skipped[0].reason
    assert reason.startswith("header not read: the Deflated data set inflates beyond the")
    assert "bytes its header declares" in reason
    assert any(f.source.path == paths[2] and f.problem is None for f in header.frames)


def test_a_zip_member_zipfile_cannot_read_is_named_and_said(tmp_path: Path) -> None:
    """A member in Deflate64 (method 9: Windows' Explorer writes it for large archives)
    was skipped as "unreadable file (NotImplementedError)"; when it was the first or last
    slice, the study ran one slice short without a word."""
    paths = _series(tmp_path / "files", "1.2.840.10008.1.2.1")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:
        for path in paths:
            zf.writestr(path.name, path.read_bytes())
    data = bytearray(archive.getvalue())
    data[8:10] = struct.pack("<H", 9)  # the first member's method: local header ...
    directory = data.index(b"PK\x01\x02")
    data[directory + 10 : directory + 12] = struct.pack("<H", 9)  # ... and central directory
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "study.zip").write_bytes(bytes(data))
    header = discover_series(tmp_path / "study")[0]
    assert [s.reason for s in header.skipped] == [
        "unreadable zip member: compression method 9 (deflate64) is not supported; zip the "
        "files with Deflate"
    ]
    loaded = load_series(header)
    assert loaded.volume.shape[0] == 3
    assert any(
        w.startswith("1 file(s) of the input were skipped, unreadable: unreadable zip member")
        and w.endswith("if they were images of this series, it was analysed without them")
        for w in loaded.warnings
    ), loaded.warnings


@pytest.mark.parametrize("syntax", ["1.2.840.10008.1.2.1", RLELossless])
def test_more_after_the_pixel_data_than_a_header_may_hold_is_refused(
    tmp_path: Path, syntax: str
) -> None:
    """A 1 MB zip whose member held 1 GiB of zeros after its pixels cost 1 GiB of the
    temporary folder (the member is copied out to be decoded) and ran; what follows the
    pixel data is now bounded as the header is. Here with a 1 MiB header bound, 2 MiB."""
    policy = IngestPolicy(max_header_bytes=2**20)
    paths = _series(tmp_path / "files", syntax)
    with open(paths[1], "ab") as out:  # a private OB element after the Pixel Data
        out.write(struct.pack("<HH2sH", 0x7FE1, 0x0010, b"LO", 6) + b"BOMB  ")
        out.write(struct.pack("<HH2sHL", 0x7FE1, 0x1010, b"OB", 0, 2 * 2**20) + bytes(2 * 2**20))
    (tmp_path / "study").mkdir()
    with zipfile.ZipFile(tmp_path / "study" / "study.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for path in paths:
            zf.write(path, path.name)
    assert (tmp_path / "study" / "study.zip").stat().st_size < 64 * 1024
    for folder in ("study", "files"):  # the zip member, and the plain file
        header = discover_series(tmp_path / folder, policy=policy)[0]
        odd = next(f for f in header.frames if f.source.name == paths[1].name)
        assert odd.problem is not None and odd.problem.code == "input_too_large", odd.problem
        assert f"{2 * 2**20 + 26} bytes follow the Pixel Data element, more than" in (
            odd.problem.text
        )
        assert all(f.problem is None for f in header.frames if f is not odd)


@pytest.mark.parametrize(("spacing", "refused"), [("0.5", True), ("0.7", False)])
def test_a_functional_group_both_shared_and_per_frame_must_agree(
    tmp_path: Path, spacing: str, refused: bool
) -> None:
    """Pixel Measures per frame (0.5 mm) beside the shared ones (0.7 mm): the study ran
    on the per-frame value, and which the writer meant cannot be told (PS3.3 C.7.6.16
    allows a group in one of the two only). The same values in both are harmless."""
    path = make_enhanced_series(tmp_path / "enhanced", n_frames=6, rows=ROWS, cols=COLS)
    ds = pydicom.dcmread(path)
    shared = ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    assert list(map(str, shared.PixelSpacing)) == ["0.7", "0.9"]
    for item in ds.PerFrameFunctionalGroupsSequence:
        measures = pydicom.Dataset()
        measures.PixelSpacing = [spacing, "0.9"]
        measures.SliceThickness = shared.SliceThickness
        item.PixelMeasuresSequence = [measures]
    ds.save_as(path)
    frames = discover_series(tmp_path / "enhanced")[0].frames
    if not refused:
        assert all(f.problem is None and f.pixel_spacing == (0.7, 0.9) for f in frames)
        return
    assert frames[0].problem is not None and frames[0].problem.code == "instance_invalid"
    assert frames[0].problem.text.startswith(
        "frame 1: Pixel Spacing differs between its own and the shared Pixel Measures "
        "functional group"
    )


@pytest.mark.parametrize(
    ("sequence", "keyword", "value", "name"),
    [
        ("PixelMeasuresSequence", "PixelSpacing", [3, 3], "Pixel Spacing"),
        (
            "PlaneOrientationSequence",
            "ImageOrientationPatient",
            [0, 1, 0, 0, 0, -1],
            "Image Orientation (Patient)",
        ),
    ],
)
def test_one_frame_contradicting_the_shared_group_is_named(
    tmp_path: Path, sequence: str, keyword: str, value: list[int], name: str
) -> None:
    """One frame's own group against the shared one was read as the frame's and split
    off, and the series refused for the gap it left ("split off as part 1"); now the
    instance is refused for the contradiction itself."""
    path = make_enhanced_series(tmp_path / "enhanced", n_frames=8)
    ds = pydicom.dcmread(path)
    item = pydicom.Dataset()
    setattr(item, keyword, value)
    setattr(ds.PerFrameFunctionalGroupsSequence[5], sequence, [item])
    ds.save_as(path)
    header = discover_series(tmp_path / "enhanced")[0]
    with pytest.raises(InstanceError, match=rf"frame 6: {re.escape(name)} differs between"):
        load_series(header)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_float_pixel_data_that_is_not_finite_is_refused(tmp_path: Path, value: float) -> None:
    """A NaN in one slice's Float Pixel Data loaded (the CT scale bound ignores NaN) and
    ran through the models; the NIfTI path already refused it."""
    paths = _series(tmp_path / "study", "1.2.840.10008.1.2.1")
    for k, path in enumerate(paths):
        ds = pydicom.dcmread(path)
        hu = ds.pixel_array.astype(np.float32) + np.float32(ds.RescaleIntercept)
        if k == 2:
            hu[3, 3] = value
        del ds.PixelData, ds.BitsStored, ds.HighBit, ds.PixelRepresentation
        ds.RescaleSlope, ds.RescaleIntercept, ds.BitsAllocated = "1", "0", 32
        ds.FloatPixelData = hu.tobytes()
        ds.save_as(path)
    with pytest.raises(StudyError, match="1 of 5760 voxels are not finite numbers") as info:
        load_series(discover_series(tmp_path / "study")[0])
    assert info.value.code == "implausible_pixel_values"
