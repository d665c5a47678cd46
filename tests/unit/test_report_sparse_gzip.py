"""The label maps' gzip writer: empty stretches are spliced in, not compressed, and the
file is still one gzip member that every reader decodes to the bytes written."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from radserve.domain import Volume
from radserve.ingest.nifti import save_nifti
from radserve.report import write_label_map
from radserve.report.sparse_gzip import BLOCK, SparseGzipWriter


def _one_member(path: Path) -> bytes:
    """The decompressed bytes, checking the file is a single complete gzip member."""
    inflate = zlib.decompressobj(wbits=31)
    out = inflate.decompress(path.read_bytes())
    assert inflate.eof and inflate.unused_data == b""
    return out


@pytest.mark.parametrize("seed", range(3))
def test_writes_in_any_pieces_read_back_as_written(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = np.zeros(40 * BLOCK + 123, np.uint8)
    for start in rng.integers(0, data.size, 12):  # islands, some across block edges
        data[start : start + rng.integers(1, 3 * BLOCK)] = rng.integers(1, 9)
    data[: 3 * BLOCK] = 0  # a leading run of empty blocks
    data[-2 * BLOCK :] = 0  # and a trailing one
    cuts = np.sort(rng.integers(0, data.size, 25))
    with (tmp_path / "x.gz").open("wb") as file, SparseGzipWriter(file) as out:
        for piece in np.split(data, cuts):
            out.write(piece.tobytes())
        assert out.tell() == data.size
    raw = _one_member(tmp_path / "x.gz")
    assert raw == data.tobytes() == gzip.decompress((tmp_path / "x.gz").read_bytes())


def test_an_empty_map_costs_no_compression_and_reads_back(tmp_path: Path) -> None:
    with (tmp_path / "z.gz").open("wb") as file, SparseGzipWriter(file) as out:
        out.seek(5)  # forward only, by zeros: how nibabel reaches the data offset
        out.write(bytes(100 * BLOCK))
        with pytest.raises(OSError, match="forward"):
            out.seek(3)
    assert _one_member(tmp_path / "z.gz") == bytes(100 * BLOCK + 5)


def test_a_failed_write_ends_no_member(tmp_path: Path) -> None:
    """What a failed block wrote has no trailer: no gzip reader takes it for a whole file
    (and :func:`radserve.durable.write_with` never renames it to its final name)."""
    with (tmp_path / "f.gz").open("wb") as file:
        with pytest.raises(RuntimeError), SparseGzipWriter(file) as out:
            out.write(b"\x01" * 10)
            raise RuntimeError("the writer's caller failed")
        assert out.closed
    with pytest.raises(EOFError):
        gzip.decompress((tmp_path / "f.gz").read_bytes())


def test_label_map_reads_back_as_nibabels_own_file(tmp_path: Path) -> None:
    """Header and voxels of the report's .nii.gz are those of nibabel's own writer."""
    labels = np.zeros((6, 128, 256), np.uint8)  # 32 KiB slices: two blocks each
    labels[2:4, 70:90, 10:200] = 3
    labels[5, 127, 255] = 1
    volume = Volume(labels, np.diag([2.5, 0.7, 0.9, 1.0]))
    ours = write_label_map(volume, tmp_path / "ours.nii.gz")
    theirs = save_nifti(volume, tmp_path / "theirs.nii.gz", label_map=True)
    assert _one_member(ours) == gzip.decompress(theirs.read_bytes())
    assert np.array_equal(np.asanyarray(nib.load(ours).dataobj), labels.transpose(2, 1, 0))
