"""``radserve run`` as a user calls it: exit status, report folder, DICOM results, errors."""

from __future__ import annotations

import json
import os
import random
import zipfile
from pathlib import Path

import pydicom
import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series, write_not_dicom
from tests.factories.results import lesions_hu
from tests.factories.server_process import run_radserve


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    return write_test_bundles(root / "models"), write_test_pipeline(root)


def test_run_writes_report_label_maps_and_dicom(bundles, tmp_path: Path) -> None:
    models, pipeline = bundles
    make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    out = tmp_path / "out"
    done = run_radserve(
        "run", str(tmp_path / "study"), "--pipeline", str(pipeline), "--out", str(out),
        "--models-dir", str(models),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert str(out / "report.json") in done.stdout.replace("\n", "")  # rich wraps long paths
    assert report["findings"], "the bright spheres are findings"
    for name in ("organs.nii.gz", "findings.nii.gz", "measurements-sr.dcm", "findings-seg.dcm"):
        assert (out / name).is_file(), name


def test_a_zipped_study_gets_its_dicom_seg_and_sr_too(bundles, tmp_path: Path) -> None:
    """The study zipped (folders inside, as a PACS export writes them) is read inside the
    archive and gets the same DICOM results as the folder, referencing its slices, and no
    copy is left behind. Until 2026-12-07 it printed "DICOM SEG/SR skipped"."""
    models, pipeline = bundles
    folder = tmp_path / "study"
    make_ct_series(
        folder / "series1", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    archive = tmp_path / "study.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(tmp_path).as_posix())
    out = tmp_path / "out"
    done = run_radserve(
        "run", str(archive), "--pipeline", str(pipeline), "--out", str(out),
        "--models-dir", str(models),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "skipped" not in done.stdout
    slices = {
        str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID)
        for p in folder.rglob("*.dcm")
    }
    for name in ("measurements-sr.dcm", "findings-seg.dcm", "organs-seg.dcm"):
        written = pydicom.dcmread(out / name)
        referenced = {
            str(item.ReferencedSOPInstanceUID)
            for series in written.get("ReferencedSeriesSequence", [])
            for item in series.ReferencedInstanceSequence
        }
        if name.endswith("seg.dcm"):
            assert referenced and referenced <= slices, name  # slices inside the archive
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".dcm") == [
        "findings-seg.dcm", "measurements-sr.dcm", "organs-seg.dcm",
    ]  # fmt: skip


def test_not_dicom_is_one_clear_line_and_exit_2(bundles, tmp_path: Path) -> None:
    models, pipeline = bundles
    write_not_dicom(tmp_path / "study" / "notes.txt")
    done = run_radserve(
        "run", str(tmp_path / "study"), "--pipeline", str(pipeline), "--out", str(tmp_path / "o"),
        "--models-dir", str(models),
    )  # fmt: skip
    assert done.returncode == 2
    assert "error [not_dicom]" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_pipeline_names_the_available_ones(tmp_path: Path) -> None:
    make_ct_series(tmp_path / "study", n_slices=4)
    done = run_radserve("run", str(tmp_path / "study"), "--pipeline", "ct-chest", "--out", "x")
    assert done.returncode == 2
    assert "unknown pipeline 'ct-chest'" in done.stderr and "ct-chest-abdomen" in done.stderr


def test_provider_choice_reaches_the_report_and_a_missing_one_is_refused(
    bundles, tmp_path: Path
) -> None:
    models, pipeline = bundles
    make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    common = ("--pipeline", str(pipeline), "--models-dir", str(models), "--no-dicom")
    done = run_radserve(
        "run", str(tmp_path / "study"), *common, "--out", str(tmp_path / "cpu"),
        "--provider", "CPUExecutionProvider",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "cpu" / "report.json").read_text())
    assert report["runtime"]["providers"] == ["CPUExecutionProvider"]
    done = run_radserve(
        "run", str(tmp_path / "study"), *common, "--out", str(tmp_path / "gpu"),
        "--provider", "CUDAExecutionProvider",
    )  # fmt: skip
    assert done.returncode == 2
    assert "CUDAExecutionProvider" in done.stderr and "were asked for" in done.stderr
    assert "Traceback" not in done.stderr


def _damaged_jpeg_lossless(folder: Path) -> None:
    """A CT whose JPEG Lossless fragments are a frame header that fits the slice, a
    Huffman table and a scan header (so the header check lets it through to the
    decoder: since 2026-12-08 it walks every segment up to the scan) and then, in the
    scan, a table marker of a bogus length and random bytes: GDCM's libjpeg prints
    "Bogus marker length" on its process's stderr."""
    import struct

    import pydicom
    from pydicom.encaps import encapsulate

    for k, path in enumerate(make_ct_series(folder, n_slices=4)):
        ds = pydicom.dcmread(path)
        # SOI; SOF3: length 11, 16-bit, Rows, Columns, 1 component (id 1, 1x1, table 0)
        frame = b"\xff\xd8\xff\xc3" + struct.pack(">HBHHB", 11, 16, ds.Rows, ds.Columns, 1)
        frame += b"\x01\x11\x00"
        # DHT: table 0, one code of length 1; SOS: component 1, table 0, predictor 1
        frame += b"\xff\xc4\x00\x14\x00" + bytes([1] + [0] * 15) + b"\x00"
        frame += b"\xff\xda\x00\x08\x01\x01\x00\x01\x00\x00"
        frame += b"\xff\xc4\x00\x01" + random.Random(k).randbytes(600)
        ds.PixelData = encapsulate([frame])
        ds["PixelData"].VR = "OB"
        ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.70"
        ds.save_as(path)


def test_decoders_stderr_is_logged_as_json_lines_and_its_fifo_removed(
    bundles, tmp_path: Path
) -> None:
    """What the decoding processes' native code prints reaches ``radserve run``'s log
    through the relay ``radserve serve`` uses (log_routing.WorkerLogs), as JSON lines with
    --json-logs; the run stops the processes when done, so the relay's FIFO folder is
    not left in $TMPDIR (every such run left one before 2026-12-03)."""
    models, pipeline = bundles
    _damaged_jpeg_lossless(tmp_path / "study")
    (tmp_path / "tmp").mkdir()
    done = run_radserve(
        "run", str(tmp_path / "study"), "--pipeline", str(pipeline), "--out", str(tmp_path / "o"),
        "--models-dir", str(models), "--json-logs",
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )  # fmt: skip
    assert done.returncode == 2 and "error [decode_failed]" in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines if not line.startswith("error [")]
    assert len(records) == len(lines) - 1, done.stderr  # nothing else: no plain line
    native = [r for r in records if r["logger"] == "radserve.native_stderr"]
    assert any("Bogus marker length" in r["msg"] for r in native), records
    assert list((tmp_path / "tmp").iterdir()) == []
