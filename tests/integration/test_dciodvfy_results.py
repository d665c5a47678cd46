"""Every SEG and SR radserve writes passes dciodvfy with no "Error" line.

The source is a phantom CT series (itself dciodvfy-clean) run through the pipeline with
threshold models, so the objects are built from real reports: organs, several findings,
and the variants (SR without SEG, SR without findings, other character sets).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pydicom
import pytest
from tests.factories.dciodvfy import dciodvfy_errors, dciodvfy_findings
from tests.factories.dicom_series import make_legacy_enhanced
from tests.factories.results import relabel, run_test_pipeline

from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.report.dicom import write_dicom_results, write_sr
from radserve.report.schema import Report

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy not installed"),
]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, list[Path], Path]:
    root = tmp_path_factory.mktemp("dciodvfy")
    phantom = generate_phantom(PhantomSpec.random(3, small=True))
    files = write_dicom_series(phantom, root / "study", patient_name="Müller^Jürgen")
    result = run_test_pipeline(root, key_images=True, organ_hu=90, lesion_hu=140)
    assert result.report.findings, "the phantom should give findings with these thresholds"
    return result.report, files, root / "out"


def test_seg_and_sr_pass_dciodvfy(study) -> None:
    report, files, out = study
    paths = write_dicom_results(report, out, files)
    assert len(paths) == 3
    for path in paths:
        assert dciodvfy_errors(path) == [], path.name


def test_key_image_secondary_captures_pass_dciodvfy_and_reference_their_slice(
    study, tmp_path: Path
) -> None:
    import numpy as np
    from PIL import Image

    report, files, out = study
    assert report.outputs.key_images, "the run should have written key images"
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    paths = write_dicom_results(report, result_dir, files, key_images=True)
    scs = [p for p in paths if p.name.endswith("-sc.dcm")]
    assert len(scs) == len(report.outputs.key_images)
    by_uid = {str(pydicom.dcmread(f, stop_before_pixels=True).SOPInstanceUID): f for f in files}
    series = set()
    for path, key_image in zip(scs, report.outputs.key_images, strict=True):
        assert dciodvfy_errors(path) == [], path.name
        ds = pydicom.dcmread(path)
        assert ds.SOPClassUID == "1.2.840.10008.5.1.4.1.1.7"  # Secondary Capture
        assert ds.StudyInstanceUID == report.study.study_instance_uid
        assert str(ds.PatientName) == "Müller^Jürgen"
        assert ds.BurnedInAnnotation == "YES"
        source_uid = ds.SourceImageSequence[0].ReferencedSOPInstanceUID
        assert source_uid == report.geometry.source_sop_instance_uids[key_image.slice_index]
        assert source_uid in by_uid
        png = np.asarray(Image.open(result_dir / key_image.path).convert("RGB"))
        assert np.array_equal(ds.pixel_array, png)
        series.add(ds.SeriesInstanceUID)
    assert len(series) == 1  # one key-image series, apart from the SEG and SR series
    seg_sr_series = {
        pydicom.dcmread(p, stop_before_pixels=True).SeriesInstanceUID for p in paths if p not in scs
    }
    assert series.isdisjoint(seg_sr_series)


def test_sr_variants_pass_dciodvfy(study, tmp_path: Path) -> None:
    report, files, _ = study
    no_seg = write_sr(report, None, files, tmp_path / "no-seg.dcm")  # TID 1501 + SCOORD3D
    empty = report.model_copy(update={"findings": [], "finding_axes": []})
    no_findings = write_sr(empty, None, files, tmp_path / "no-findings.dcm")
    for path in (no_seg, no_findings):
        assert dciodvfy_errors(path) == [], path.name


@pytest.mark.parametrize(
    ("charset", "name"),
    [
        ("GB18030", "王^小明"),
        (["", "ISO 2022 IR 87"], "Yamada^Tarou=山田^太郎=やまだ^たろう"),
    ],
)
def test_other_character_sets_pass_dciodvfy(study, tmp_path: Path, charset, name) -> None:
    report, files, out = study
    copies = relabel(files, tmp_path, name, charset=charset)
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    for path in write_dicom_results(report, result_dir, copies, key_images=True):
        assert str(pydicom.dcmread(path, stop_before_pixels=True).PatientName) == name
        assert dciodvfy_errors(path) == [], path.name


@pytest.mark.parametrize(
    ("charset", "codec", "name"),
    [
        ("ISO_IR 100", "latin-1", "Müller^" + "é" * 70),  # 77 bytes Latin-1, 148 UTF-8
        ("GB18030", "gb18030", "王^" + "ß" * 20),  # 83 bytes GB18030 (ß: 4), 44 UTF-8
    ],
)
def test_long_names_are_cut_in_the_studys_character_set_and_pass_dciodvfy(
    study, tmp_path: Path, charset: str, codec: str, name: str
) -> None:
    """A name over PN's 64 bytes is cut by its bytes in the declared Specific Character
    Set: before session 19 it was counted as UTF-8, so the GB18030 one (44 UTF-8 bytes)
    was copied whole at 83 bytes and the Latin-1 one cut to 32 characters."""
    report, files, out = study
    copies = relabel(files, tmp_path, name, charset=charset)
    expected = next(
        name[:n] for n in range(len(name), 0, -1) if len(name[:n].encode(codec)) <= 64
    ).rstrip("^ ")
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    paths = write_dicom_results(report, result_dir, copies)
    assert len(paths) == 3  # two SEGs and the SR
    for path in paths:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert ds.SpecificCharacterSet == charset, path.name
        assert str(ds.PatientName) == expected, path.name
        assert dciodvfy_errors(path) == [], path.name


@pytest.mark.parametrize(
    ("charset", "name", "declared", "read_back"),
    [
        # Latin-1 bytes no Specific Character Set declares: pydicom reads them as ISO_IR 100
        ("", "Müller^Jürgen".encode("latin-1"), "ISO_IR 100", "Müller^Jürgen"),
        # UTF-8 bytes no Specific Character Set declares: their bytes say UTF-8
        ("", "Müller^Jürgen=ミュラー^ユルゲン".encode(), "ISO_IR 192", None),
        # a term nobody knows: the text is read in the default repertoire, written as UTF-8
        ("ISO_IR 999", "Müller^Jürgen".encode("latin-1"), "ISO_IR 192", "Müller^Jürgen"),
        (
            ["", "ISO 2022 IR 149"],
            "Hong^Gildong=\x1b$)C\xc8\xab^\xb1\xe6\xb5\xbf".encode("latin-1"),
            ["", "ISO 2022 IR 149"],
            "Hong^Gildong=홍^길동",
        ),
        ("ISO_IR 192", "Müller^Jürgen=ミュラー^ユルゲン".encode(), "ISO_IR 192", None),
    ],
)
def test_a_name_in_an_undeclared_or_unknown_character_set_comes_out_declared(
    study, tmp_path: Path, charset, name, declared, read_back
) -> None:
    """Found by tools/edge_probe.py (charset_latin1_undeclared, charset_utf8_undeclared,
    charset_unknown_term): the SEG and SR copied the name's Latin-1 or UTF-8 bytes
    without declaring a character set (dciodvfy: "Character invalid for character
    repertoire"), or copied the unknown term."""
    report, files, out = study
    copies = relabel(files, tmp_path, name, charset=charset)
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    for path in write_dicom_results(report, result_dir, copies, key_images=True):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert ds.SpecificCharacterSet == declared, path.name
        assert str(ds.PatientName) == (read_back or name.decode()), path.name
        assert dciodvfy_errors(path) == [], path.name
        assert dciodvfy_text_findings(path) == [], path.name  # its warnings too


def dciodvfy_text_findings(path: Path) -> list[str]:
    """dciodvfy's lines about character sets and text that does not fit its repertoire."""
    words = ("repertoire", "Specific Character Set", "escape")
    return [line for line in dciodvfy_findings(path) if any(w in line for w in words)]


def _with_header(files: list[Path], folder: Path, **values: str | None) -> list[Path]:
    """Copies of ``files`` with attributes set (None: removed)."""
    folder.mkdir(parents=True)
    out = []
    for path in files:
        ds = pydicom.dcmread(path)
        for keyword, value in values.items():
            if value is None:
                if keyword in ds:
                    delattr(ds, keyword)
            else:
                setattr(ds, keyword, value)
        ds.save_as(folder / path.name)
        out.append(folder / path.name)
    return out


@pytest.mark.parametrize(
    ("header", "laterality"),
    [
        ({}, None),  # CHEST: unpaired, no Laterality attribute
        ({"BodyPartExamined": "BREAST", "Laterality": "L"}, "L"),  # paired: the source's side
        ({"BodyPartExamined": None, "ImageLaterality": "B"}, None),
    ],
)
def test_key_images_have_no_dciodvfy_warning_and_the_study_description(
    study, tmp_path: Path, header, laterality
) -> None:
    """Issue 11 (8): SCs had an empty Laterality (a dciodvfy warning on every one) and
    no Study Description (a Study IE that differed from the source's, per dcentvfy)."""
    report, files, out = study
    sources = _with_header(files, tmp_path / "study", **header)
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    paths = write_dicom_results(report, result_dir, sources, key_images=True)
    scs = [p for p in paths if p.name.endswith("-sc.dcm")]
    assert scs
    source = pydicom.dcmread(sources[0], stop_before_pixels=True)
    assert source.StudyDescription
    for path in scs:
        assert dciodvfy_findings(path) == [], path.name
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert ds.StudyDescription == source.StudyDescription
        assert ds.get("Laterality") == laterality
    if shutil.which("dcentvfy"):
        run = subprocess.run(
            ["dcentvfy", *map(str, sources), *map(str, scs)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        lines = (run.stdout + run.stderr).splitlines()
        differing = [line for line in lines if "present in one instance but not" in line]
        assert differing == []


def test_key_image_laterality_is_empty_only_when_the_source_says_nothing(
    study, tmp_path: Path
) -> None:
    report, files, out = study
    sources = _with_header(files, tmp_path / "study", BodyPartExamined=None)
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    paths = write_dicom_results(report, result_dir, sources, key_images=True)
    for path in (p for p in paths if p.name.endswith("-sc.dcm")):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert ds.Laterality == ""  # Type 2C, and the side is really unknown
        assert dciodvfy_errors(path) == [], path.name


def test_results_of_an_enhanced_source_pass_dciodvfy(tmp_path: Path) -> None:
    """The phantom series converted by highdicom into one Legacy Converted Enhanced CT
    instance (a conformant multi-frame source): SEG, SR and key images reference its
    frames and pass dciodvfy, as those of the classic series do."""
    phantom = generate_phantom(PhantomSpec.random(3, small=True))
    classic = write_dicom_series(phantom, tmp_path / "classic")
    source = make_legacy_enhanced(classic, tmp_path / "study" / "enhanced.dcm")
    result = run_test_pipeline(tmp_path, key_images=True, organ_hu=90, lesion_hu=140)
    assert result.report.findings
    assert len(result.report.geometry.source_frame_numbers) == len(classic)
    paths = write_dicom_results(result.report, tmp_path / "out", [source], key_images=True)
    assert {p.name for p in paths} >= {"measurements-sr.dcm", "keyimage-01-sc.dcm"}
    for path in paths:
        assert dciodvfy_errors(path) == [], path.name


# What model.yaml's rule (radserve.models.dicom_text) lets through at its longest and
# oddest: a CodeMeaning of exactly 64 UTF-8 bytes outside Latin-1, with markup and quotes;
# a label name of 91 characters (SegmentLabel and tracking identifiers are cut to 64
# bytes); a model name of 64 bytes. dciodvfy counts bytes: before, a 64-character
# meaning like this one (74 bytes) and the label cut to 64 characters were its errors.
ODD_MEANING = "Läsion <b>&amp;</b> \"q\" 'O'Brien' αβγ 肝臓 — " + "x" * 11
LONG_LABEL = "Leber – rechter Lappen, Segment VII " + "lang " * 11
ODD_MODEL = "Modèle «α» <i>test</i> " + "m" * 37


def _renamed(report: Report) -> Report:
    """``report`` with every label, meaning and model name the test bundles gave replaced
    by the long and odd ones above (values only: the label maps on disk stay)."""
    swap = {
        "Liver": ODD_MEANING,
        "Lesion": ODD_MEANING[::-1],
        "liver": LONG_LABEL,
        "liver_lesion": LONG_LABEL[::-1],
        "organs-test": ODD_MODEL,
        "lesions-test": ODD_MODEL[::-1],
    }

    def walk(value: object) -> object:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return swap.get(value, value) if isinstance(value, str) else value

    return Report.model_validate(walk(report.model_dump(mode="json")))


def test_the_longest_and_oddest_names_model_yaml_allows_pass_dciodvfy(
    study, tmp_path: Path
) -> None:
    from radserve.models.dicom_text import LO_MAX_BYTES, dicom_text

    for meaning in (ODD_MEANING, ODD_MEANING[::-1], ODD_MODEL):
        assert dicom_text(meaning, "meaning", max_bytes=LO_MAX_BYTES) == meaning
        assert len(meaning.encode()) == LO_MAX_BYTES
    report, files, out = study
    renamed = _renamed(report)
    assert {s.concept.meaning for m in renamed.outputs.label_maps for s in m.segments} == {
        ODD_MEANING,
        ODD_MEANING[::-1],
    }
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    paths = write_dicom_results(renamed, result_dir, files)
    assert len(paths) == 3
    for path in paths:
        assert dciodvfy_errors(path) == [], path.name
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        meanings = {str(e.value) for e in ds.iterall() if e.keyword == "CodeMeaning"}
        assert meanings & {ODD_MEANING, ODD_MEANING[::-1]}, path.name  # written whole
