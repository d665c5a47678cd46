"""A header that declares UTF-8 (ISO_IR 192) over a name in Latin-1 bytes, the common
mislabel: the name is read as Latin-1, everywhere it goes.

Before session 36 pydicom's replacement characters went out: a PACS probe's
``M\\xfcller^J\\xf6rg`` reached the SEG, SR, FHIR, QIDO and the console as
``M\\ufffdller^J\\ufffdrg``, with no warning."""

from __future__ import annotations

from pathlib import Path

import pydicom
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesions_hu, run_test_pipeline

from radserve.ingest import discover_series
from radserve.report.dicom import write_dicom_results

LATIN1_NAME = b"M\xfcller^J\xf6rg "  # even length, as DICOM pads it


def _mislabel(files: list[Path]) -> None:
    """The bytes patched in the file (pydicom re-encodes a value it writes)."""
    for path in files:
        ds = pydicom.dcmread(path)
        ds.SpecificCharacterSet, ds.PatientName = "ISO_IR 192", "Mxller^Jxrg"
        ds.save_as(path)
        data = path.read_bytes()
        assert data.count(b"Mxller^Jxrg ") == 1
        path.write_bytes(data.replace(b"Mxller^Jxrg ", LATIN1_NAME))


def test_a_latin1_name_under_a_declared_utf8_is_read_as_latin1(tmp_path: Path) -> None:
    files = make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    _mislabel(files)
    (header,) = discover_series(tmp_path / "study")
    assert header.patient.patient_name == "Müller^Jörg"
    report = run_test_pipeline(tmp_path).report
    results = write_dicom_results(report, tmp_path / "out", files)
    assert results
    for path in results:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert str(ds.PatientName) == "Müller^Jörg", path.name
        assert "\ufffd" not in str(ds.PatientName)
