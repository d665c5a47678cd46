"""Written phantom slices are valid CT Image objects according to dciodvfy."""

from __future__ import annotations

import shutil

import pytest
from tests.factories.dciodvfy import dciodvfy_report

from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy not installed"),
]


@pytest.fixture(scope="module")
def phantom():
    return generate_phantom(PhantomSpec.random(5, small=True), range(20, 23))


@pytest.mark.parametrize("syntax", ["explicit", "jpeg2000", "rle"])
def test_dciodvfy_reports_no_errors(phantom, tmp_path, syntax):
    paths = write_dicom_series(phantom, tmp_path, transfer_syntax=syntax, patient_name="Ünal^Ayşe")
    report = dciodvfy_report(paths[1])
    assert "CTImage" in report
    errors = [line for line in report.splitlines() if "Error" in line]
    assert not errors, report
