"""HTJ2K test data: pydicom 3.0 has no HTJ2K encoder, so OpenJPH's ``ojph_compress``
(Debian package ``openjph-tools``) encodes each frame and pydicom encapsulates the
codestreams into the DICOM file (nothing hand-encoded)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pydicom
from pydicom.encaps import encapsulate
from pydicom.uid import HTJ2K, HTJ2KLossless

OJPH_COMPRESS = shutil.which("ojph_compress")
SOC_SIZ = b"\xff\x4f\xff\x51"  # start of codestream, image and tile size
CAP = b"\xff\x50"  # capabilities marker: Part 15 (High-Throughput) codestreams carry it


def htj2k_codestream(pixels_le: bytes, *, rows: int, cols: int, bits: int, signed: bool,
                     lossless: bool = True) -> bytes:  # fmt: skip
    """One grey frame (little-endian 16-bit samples) as an HTJ2K codestream."""
    assert OJPH_COMPRESS is not None, "ojph_compress (openjph-tools) is not installed"
    with tempfile.TemporaryDirectory() as folder:
        raw, out = Path(folder) / "frame.raw", Path(folder) / "frame.j2c"
        raw.write_bytes(pixels_le)
        command = [
            OJPH_COMPRESS, "-i", str(raw), "-o", str(out),
            "-dims", f"{{{cols},{rows}}}", "-num_comps", "1", "-downsamp", "{1,1}",
            "-signed", "true" if signed else "false", "-bit_depth", str(bits),
            "-reversible", "true" if lossless else "false",
        ]  # fmt: skip
        if not lossless:
            command += ["-qstep", "0.001"]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        return out.read_bytes()


def to_htj2k(source: Path, target: Path, *, lossless: bool = True) -> Path:
    """A copy of single-frame ``source`` with its pixels HTJ2K-encoded (Transfer Syntax
    HTJ2K Lossless 1.2.840.10008.1.2.4.201, or HTJ2K 1.2.840.10008.1.2.4.203)."""
    ds = pydicom.dcmread(source)
    array = ds.pixel_array
    signed = bool(ds.PixelRepresentation)
    samples = array.astype("<i2" if signed else "<u2").tobytes()
    codestream = htj2k_codestream(
        samples, rows=ds.Rows, cols=ds.Columns, bits=ds.BitsStored, signed=signed,
        lossless=lossless,
    )  # fmt: skip
    ds.PixelData = encapsulate([codestream])
    ds["PixelData"].VR = "OB"
    ds.file_meta.TransferSyntaxUID = HTJ2KLossless if lossless else HTJ2K
    if not lossless:
        ds.LossyImageCompression = "01"
    target.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(target, enforce_file_format=True)
    return target
