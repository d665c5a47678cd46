"""GDCM is loaded when pydicom first decodes with it, and pydicom chooses among the same
plugins in the same order as with a plain import. Each check runs in a fresh interpreter,
whose first import of pydicom comes after radserve's (or not, for the reference)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.factories.dicom_series import dcmtk_compress, make_ct_series

_PLUGIN_ORDER = """
import json, sys
{first}
import pydicom
from pydicom.pixels.decoders.base import _PIXEL_DATA_DECODERS
from pydicom.pixels.encoders.base import _PIXEL_DATA_ENCODERS
before = "gdcm" in sys.modules
downloads = "requests" in sys.modules or "tqdm" in sys.modules
{then}
order = {{
    uid: [list(c._available), sorted(c._unavailable)]
    for table in (_PIXEL_DATA_DECODERS, _PIXEL_DATA_ENCODERS)
    for uid, (c, _) in table.items()
}}
print(json.dumps({{
    "gdcm_at_import": before, "downloads": downloads, "order": order,
    "gdcm_loaded": "gdcm" in sys.modules,
}}))
"""


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_radserve_imports_pydicom_without_gdcm_and_pydicoms_plugin_order_is_kept() -> None:
    plain = _run(_PLUGIN_ORDER.format(first="", then=""))
    deferred = _run(_PLUGIN_ORDER.format(first="import radserve", then=""))
    loaded = _run(
        _PLUGIN_ORDER.format(
            first="import radserve",
            then="from radserve.pydicom_plugins import load_gdcm; load_gdcm()",
        )
    )
    assert plain["gdcm_at_import"] is True
    assert plain["downloads"] is True
    assert deferred["gdcm_at_import"] is False
    assert deferred["gdcm_loaded"] is False
    assert deferred["downloads"] is False  # pydicom's test-data download modules
    assert any("gdcm" in available for available, _ in plain["order"].values())
    assert deferred["order"] == plain["order"]  # the stand-ins hold GDCM's places
    assert loaded["gdcm_loaded"] is True
    assert loaded["order"] == plain["order"]


_LOAD = """
import sys, hashlib
import radserve
from radserve.ingest import discover_series, load_series
(header,) = discover_series(sys.argv[1])
volume = load_series(header).volume.array
print(hashlib.sha256(volume.tobytes()).hexdigest(), "gdcm" in sys.modules)
"""

_PYDICOM_ONLY = """
import sys, hashlib
import radserve
from pydicom import dcmread
arrays = [dcmread(path).pixel_array for path in sorted(sys.argv[1:])]
print(hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest(), "gdcm" in sys.modules)
"""


@pytest.mark.tools
def test_a_jpeg_lossless_study_loads_gdcm_on_demand_with_the_same_pixels(tmp_path: Path) -> None:
    if shutil.which("dcmcjpeg") is None:
        pytest.skip("dcmtk's dcmcjpeg is not installed")
    native = make_ct_series(tmp_path / "native", n_slices=3, rows=32, cols=32)
    (tmp_path / "jpeg").mkdir()
    for path in native:
        dcmtk_compress(path, tmp_path / "jpeg" / path.name, "jpeg-lossless-sv1")
    from radserve.ingest import discover_series, load_series

    (header,) = discover_series(tmp_path / "native")
    expected = load_series(header).volume.array
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, str(tmp_path / "jpeg")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    digest, gdcm_loaded = out.stdout.split()
    assert digest == hashlib.sha256(np.ascontiguousarray(expected).tobytes()).hexdigest()
    # decoded in the decoding processes (JPEG Lossless always is, since 06775e4: GDCM's
    # libjpeg writes to the stderr of the process it runs in), so this one never loads it
    assert gdcm_loaded == "False"
    # pydicom alone, in a process where radserve came first, decodes them with GDCM too
    jpeg = sorted(str(p) for p in (tmp_path / "jpeg").iterdir())
    direct = subprocess.run(
        [sys.executable, "-c", _PYDICOM_ONLY, *jpeg],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    from pydicom import dcmread

    stored = b"".join(dcmread(path).pixel_array.tobytes() for path in jpeg)
    assert direct.stdout.split() == [hashlib.sha256(stored).hexdigest(), "True"]


def test_a_native_study_loads_without_gdcm(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=3, rows=16, cols=16)
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split()[1] == "False"


def test_pydicom_imported_inside_an_import_of_requests_leaves_requests_whole() -> None:
    """dicomweb-client imports requests, which (through this package) may import pydicom
    for the first time: the requests being imported must not be hidden from itself."""
    code = """
import sys, importlib.abc, importlib.util
import radserve

class ImportPydicomInsideRequests(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "requests.models":
            return None
        import pydicom  # first import of pydicom, while requests is half imported
        return None

sys.meta_path.insert(0, ImportPydicomInsideRequests())
import requests
print(requests.models.Response.__name__, "gdcm" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["Response", "False"]
