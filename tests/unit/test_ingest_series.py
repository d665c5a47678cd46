"""Discovery, splitting, localizers, modality, rescale/padding, enhanced multi-frame."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
from tests.factories.dicom_series import (
    AXIAL,
    CORONAL,
    DEFAULT_PATIENT,
    as_jpeg_baseline,
    make_ct_series,
    make_enhanced_series,
    make_localizer,
    make_mr_series,
    new_uid,
    oblique_orientation,
    ramp_hu,
    series_affine,
)

from radserve.errors import GeometryError, StudyError, UnsupportedModalityError
from radserve.ingest import IngestPolicy, discover_series, load_series


def _shared_uids() -> dict[str, str]:
    return {"series_uid": new_uid(), "study_uid": new_uid(), "frame_of_reference_uid": new_uid()}


def test_header_fields_and_patient_info(tmp_path: Path) -> None:
    extra = {"RequestedProcedurePriority": "STAT", "SeriesDescription": "CHEST W/O"}
    make_ct_series(tmp_path, n_slices=3, spacing=(1.5, 0.7, 0.9), extra=extra)
    (header,) = discover_series(tmp_path)
    assert (header.modality, header.number_of_instances, header.slice_thickness) == ("CT", 3, 1.5)
    assert header.body_part_examined == "CHEST" and header.part == 0
    assert len(header.files) == 3 and header.skipped == ()
    p = header.patient
    assert p.patient_name == DEFAULT_PATIENT["PatientName"]
    assert p.patient_id == DEFAULT_PATIENT["PatientID"]
    assert p.patient_birth_date == "19700101" and p.patient_sex == "O"
    assert p.accession_number == "ACC0001" and p.study_date == "20240102"
    assert p.requested_procedure_priority == "STAT"
    assert p.specific_character_set == ("ISO_IR 100",)
    assert p.referring_physician_name == "Referrer^Dr"
    # Patient data never shows up in reprs (which end up in logs and tracebacks).
    assert "Phantom" not in repr(header) and "PHANTOM" not in str(p)


def test_series_are_grouped_by_uid(tmp_path: Path) -> None:
    study = new_uid()
    make_ct_series(tmp_path / "a", n_slices=4, series_number=2, study_uid=study)
    make_mr_series(tmp_path / "b", n_slices=3, series_number=1, study_uid=study)
    headers = discover_series(tmp_path)
    assert [(h.modality, h.number_of_instances) for h in headers] == [("MR", 3), ("CT", 4)]
    assert len({h.series_instance_uid for h in headers}) == 2


def test_mr_where_ct_is_required(tmp_path: Path) -> None:
    make_mr_series(tmp_path, n_slices=3)
    (header,) = discover_series(tmp_path)
    with pytest.raises(UnsupportedModalityError, match="series modality is MR, but CT"):
        load_series(header, required_modality="CT")
    mr = load_series(header, required_modality="mr")
    np.testing.assert_array_equal(mr.volume.array, ramp_hu(3, 16, 12) + 1000)


def test_localizer_by_image_type_is_dropped(tmp_path: Path) -> None:
    uids = _shared_uids()
    make_ct_series(tmp_path, **uids)
    make_localizer(tmp_path, **uids, orientation=AXIAL, n_images=2)
    (header,) = discover_series(tmp_path)
    assert header.number_of_instances == 8 and len(header.dropped) == 2
    loaded = load_series(header)
    assert loaded.volume.shape == (8, 16, 12)
    assert any("2 localizer images" in w and "LOCALIZER" in w for w in loaded.warnings)
    with pytest.raises(GeometryError, match="localizer"):
        load_series(header, IngestPolicy(localizers="reject"))


def test_few_images_with_other_orientation_are_a_localizer(tmp_path: Path) -> None:
    uids = _shared_uids()
    make_ct_series(tmp_path, **uids)
    make_localizer(tmp_path, **uids, image_type=("ORIGINAL", "PRIMARY", "AXIAL"), rows=20)
    (header,) = discover_series(tmp_path)
    assert "another orientation" in header.dropped[0].reason


def test_mixed_orientation_is_split(tmp_path: Path) -> None:
    uids = _shared_uids()
    make_ct_series(tmp_path, n_slices=6, **uids, prefix="ax")
    make_ct_series(tmp_path, n_slices=5, orientation=CORONAL, **uids, prefix="cor")
    main, other = discover_series(tmp_path)
    assert (main.part, main.number_of_instances) == (0, 6)
    assert (other.part, other.number_of_instances) == (1, 5)
    assert main.split_reasons == {"orientation"} and other.key.endswith("#1")
    loaded = load_series(main)
    assert "another orientation" in loaded.warnings[0]
    assert load_series(other).volume.shape == (5, 16, 12)
    with pytest.raises(GeometryError, match="mixes images of orientation"):
        load_series(main, IngestPolicy(mixed_orientation="reject"))


def test_mismatched_rows_columns_are_split(tmp_path: Path) -> None:
    uids = _shared_uids()
    make_ct_series(tmp_path, **uids, prefix="big")
    make_ct_series(tmp_path, n_slices=2, rows=8, cols=8, **uids, prefix="small")
    main, other = discover_series(tmp_path)
    assert main.split_reasons == {"dimensions"} and other.number_of_instances == 2
    assert "other Rows/Columns (8×8)" in load_series(main).warnings[0]
    with pytest.raises(GeometryError, match="different Rows/Columns"):
        load_series(main, IngestPolicy(mismatched_dimensions="reject"))


def test_same_instance_twice_is_listed_once_the_later_file_kept(tmp_path: Path) -> None:
    """A second file of an instance is a copy; the one written last is used (a sender
    re-sending it with corrected header values means that one), whatever the names say;
    equal times keep the first found."""
    paths = make_ct_series(tmp_path / "s", n_slices=3)
    copy = tmp_path / "copy.dcm"  # found first (name order), written last
    shutil.copy(paths[0], copy)
    os.utime(paths[0], ns=(10**18, 10**18))
    os.utime(copy, ns=(2 * 10**18, 2 * 10**18))
    (header,) = discover_series(tmp_path)
    assert header.number_of_instances == 3 and copy in [f.path for f in header.files]
    assert [(s.source.path, s.reason) for s in header.skipped] == [
        (paths[0], "another copy of an instance already found")
    ]
    os.utime(copy, ns=(10**18 - 1, 10**18 - 1))  # now the earlier: found first, dropped
    (header,) = discover_series(tmp_path)
    assert paths[0] in [f.path for f in header.files]
    assert [(s.source.path, s.reason) for s in header.skipped] == [
        (copy, "an earlier copy of an instance received again")
    ]


def test_a_copy_of_an_instance_with_other_pixels_is_refused_whichever_comes_last(
    tmp_path: Path,
) -> None:
    """Copies of an instance may differ in header values (a corrected name) and transfer
    syntax, not in pixels: a blank copy of a slice under its SOP Instance UID was read
    or not by the order the files came in (uploaded last, it halved the liver)."""
    paths = make_ct_series(tmp_path / "s", n_slices=5, hu=ramp_hu(5, 16, 12))
    corrected = tmp_path / "corrected.dcm"
    ds = pydicom.dcmread(paths[2])
    ds.InstitutionName = "Corrected"  # a header value corrected, the pixels the same
    ds.save_as(corrected, enforce_file_format=True)
    (header,) = discover_series(tmp_path)
    assert len(header.copies) == 1
    clean = load_series(header)  # the same pixels: read, whichever copy
    assert clean.volume.shape == (5, 16, 12)
    for newer in (True, False):
        blank = tmp_path / "blank.dcm"
        ds = pydicom.dcmread(paths[2])
        ds.PixelData = bytes(len(ds.PixelData))
        ds.save_as(blank, enforce_file_format=True)
        stamp = 2 * 10**18 if newer else 10**18 - 1
        os.utime(blank, ns=(stamp, stamp))
        (header,) = discover_series(tmp_path)
        with pytest.raises(StudyError) as refused:
            load_series(header)
        assert refused.value.code == "instance_invalid"
        # named by the UID the files share, not by the files (their names are the sender's)
        assert f"(SOP Instance UID {ds.SOPInstanceUID})" in refused.value.message
        assert "blank.dcm" not in refused.value.message
        differ = 2 if newer else 1  # the blank one kept, both others differ from it
        assert f"hold different pixel data ({differ} of 2 copied frames)" in refused.value.message
        blank.unlink()


def test_float_rescale_gives_float32(tmp_path: Path) -> None:
    hu = ramp_hu(4, 16, 12) / 4
    make_ct_series(tmp_path, n_slices=4, hu=hu, rescale=(0.25, -1024.0))
    vol = load_series(discover_series(tmp_path)[0]).volume
    assert vol.array.dtype == np.float32
    np.testing.assert_allclose(vol.array, hu)


def test_values_beyond_int16_fall_back_to_float32(tmp_path: Path) -> None:
    hu = np.full((2, 16, 12), 100.0)
    hu[1, 3, 4] = 60000.0
    make_mr_series(tmp_path, n_slices=2, hu=hu, bits_stored=16)
    vol = load_series(discover_series(tmp_path)[0]).volume
    assert vol.array.dtype == np.float32 and vol.array[1, 3, 4] == 60000.0


def test_signed_16_bit_and_padding_become_air(tmp_path: Path) -> None:
    hu = ramp_hu(3, 16, 12)
    hu[:, :2, :3] = np.nan  # outside the field of view
    make_ct_series(
        tmp_path, n_slices=3, hu=hu, bits_stored=16, signed=True, pixel_padding_value=-2000
    )
    vol = load_series(discover_series(tmp_path)[0]).volume
    assert vol.array.dtype == np.int16
    assert (vol.array[:, :2, :3] == -1000).all()
    np.testing.assert_array_equal(vol.array[:, 2:], hu[:, 2:])
    other = load_series(discover_series(tmp_path)[0], IngestPolicy(ct_padding_hu=-1024))
    assert (other.volume.array[:, :2, :3] == -1024).all()


def test_int16_memory_budget() -> None:
    """A 512×512×300 CT as int16 costs ~157 MB (the dtype rule, checked without I/O)."""
    from radserve.ingest.decode import _output_dtype
    from radserve.ingest.headers import FrameRef, PixelFormat
    from radserve.ingest.sources import SourceFile

    fmt = PixelFormat("1.2.840.10008.1.2.1", 512, 512, 1, "MONOCHROME2", 16, 12, 0)
    frame = FrameRef(SourceFile(Path("x")), None, "1", "2", fmt, rescale_intercept=-1024.0)
    dtype = _output_dtype([frame])
    assert dtype == np.int16 and 512 * 512 * 300 * dtype.itemsize / 2**20 == 150.0  # 157 MB


@pytest.mark.parametrize("modality", ["CT", "MR"])
def test_enhanced_multiframe(tmp_path: Path, modality: str) -> None:
    orientation = oblique_orientation(15.0)
    origin = (5.0, -3.0, 40.0)
    per_frame = [(1.0, -1024.0 + 10 * k) for k in range(8)] if modality == "CT" else None
    hu = ramp_hu(8, 16, 12) + (0 if modality == "CT" else 1000)
    path = make_enhanced_series(
        tmp_path,
        modality=modality,  # type: ignore[arg-type]
        orientation=orientation,
        origin=origin,
        hu=hu,
        rescale_per_frame=per_frame,
        frame_order="shuffled",
        seed=7,
    )
    (header,) = discover_series(path)
    assert header.number_of_instances == 1 and header.number_of_frames == 8
    loaded = load_series(header, workers=3)
    np.testing.assert_array_equal(loaded.volume.array, hu)
    expected = series_affine(orientation=orientation, origin=origin)
    np.testing.assert_allclose(loaded.volume.affine, expected, atol=1e-5)
    # Each slice points at the frame that holds it (1-based), for SEG references.
    numbers = [s.frame_number for s in loaded.source_slices]
    assert sorted(numbers) == list(range(1, 9)) and numbers != list(range(1, 9))
    assert len(set(loaded.volume.source_sop_instance_uids)) == 1


def test_parallel_decoding_matches_serial(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=12, order="shuffled")
    (header,) = discover_series(tmp_path)
    serial = load_series(header, workers=1).volume.array
    parallel = load_series(header, workers=4).volume.array
    np.testing.assert_array_equal(serial, parallel)


def test_colour_images_are_refused_clearly(tmp_path: Path) -> None:
    from pydicom.data import get_testdata_file

    path = get_testdata_file("SC_rgb_rle.dcm", download=False)
    if path is None:
        pytest.skip("pydicom test file not installed")
    (header,) = discover_series(Path(path))
    with pytest.raises(StudyError, match="colour images") as info:
        load_series(header)
    assert info.value.code == "unsupported_pixel_format"


def _rewrite(path: Path, **values: object) -> None:
    import pydicom

    ds = pydicom.dcmread(path)
    for key, value in values.items():
        setattr(ds, key, value)
    for colour in ("Red", "Green", "Blue") if "PALETTE" in str(values) else ():
        setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [256, 0, 16])
        ds[f"{colour}PaletteColorLookupTableDescriptor"].VR = "US"
        setattr(ds, f"{colour}PaletteColorLookupTableData", bytes(512))
    ds.save_as(path, enforce_file_format=True)


@pytest.mark.parametrize(
    ("slices", "values", "message"),
    [
        # one RGB slice in a grey series failed at decode, "decoded to 40 x 40 x 3 pixels"
        (
            [3],
            {"SamplesPerPixel": 3, "PhotometricInterpretation": "RGB", "BitsAllocated": 8,
             "BitsStored": 8, "HighBit": 7, "PixelData": bytes(16 * 12 * 3)},
            "colour images (Samples per Pixel 3, RGB) cannot form an intensity volume "
            "(1 of the series' 8 images, e.g. instance 4 (SOP Instance UID ",
        ),
        # palette colour and 1-bit series ran, as intensities (1-bit: no finding at all)
        (
            range(8),
            {"PhotometricInterpretation": "PALETTE COLOR"},
            "images of Photometric Interpretation PALETTE COLOR cannot form an intensity volume",
        ),
        (
            range(8),
            {"BitsAllocated": 1, "BitsStored": 1, "HighBit": 0, "PixelData": bytes(24)},
            "1-bit images (Bits Allocated 1: a bitmap, not intensities) cannot form",
        ),
    ],
)  # fmt: skip
def test_pixels_that_are_not_intensities_are_refused_in_any_slice(
    tmp_path: Path, slices: object, values: dict[str, object], message: str
) -> None:
    """Found by tools/edge_probe.py: every slice's pixel format is checked, not the first's."""
    paths = make_ct_series(tmp_path, n_slices=8)
    for k in slices:  # type: ignore[attr-defined]
        _rewrite(paths[k], **values)
    (header,) = discover_series(tmp_path)
    with pytest.raises(StudyError) as info:
        load_series(header)
    assert info.value.code == "unsupported_pixel_format"
    assert message in info.value.message


@pytest.mark.parametrize(
    ("keyword", "value", "code", "message"),
    [
        # was "Bits Allocated is not a number (7 characters)": the word 'missing' measured
        ("BitsAllocated", None, "instance_invalid",
         "Bits Allocated is missing: the pixel format is not consistent"),
        ("PhotometricInterpretation", "XYZZY", "instance_invalid",
         "Photometric Interpretation is none of MONOCHROME1"),
    ],
)  # fmt: skip
def test_a_bad_pixel_format_is_described_as_what_it_is(
    tmp_path: Path, keyword: str, value: str | None, code: str, message: str
) -> None:
    import pydicom

    for path in make_ct_series(tmp_path, n_slices=4):
        ds = pydicom.dcmread(path)
        if value is None:
            delattr(ds, keyword)
        else:
            setattr(ds, keyword, value)
        ds.save_as(path, enforce_file_format=True)
    with pytest.raises(StudyError) as info:
        load_series(discover_series(tmp_path)[0])
    assert info.value.code == code
    assert message in info.value.message
    assert "XYZZY" not in info.value.message  # described, never quoted


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        # slice 5 at slice 4's position: was only "missing slices: 1 gaps of 4.00 mm ..."
        ("ImagePositionPatient", None, "1 slice(s) share their position with another"),
        # slice 5 coronal: set aside as a localizer, then the same bare gap message
        ("ImageOrientationPatient", [1, 0, 0, 0, 0, -1], "1 image(s) of the series were set "
         "aside first: localizer (1 instances with another orientation)"),
    ],
)  # fmt: skip
def test_a_gap_names_the_slice_that_left_it(
    tmp_path: Path, keyword: str, value: object, message: str
) -> None:
    """Found by tools/edge_probe.py: the gap is reported with why a slice is not in it."""
    import pydicom

    paths = make_ct_series(tmp_path, n_slices=8)
    ds = pydicom.dcmread(paths[5])
    if value is None:
        value = pydicom.dcmread(paths[4]).ImagePositionPatient
    setattr(ds, keyword, value)
    ds.save_as(paths[5], enforce_file_format=True)
    with pytest.raises(GeometryError) as info:
        load_series(discover_series(tmp_path)[0])
    assert "missing slices: 1 gaps" in info.value.message
    assert message in info.value.message


def test_one_sop_instance_uid_on_two_different_images_is_refused(tmp_path: Path) -> None:
    """Found by tools/edge_probe.py: the second file was dropped as "another copy", and
    the job failed on the gap it left (or, at the end of the stack, lost a slice)."""
    import pydicom

    paths = make_ct_series(tmp_path / "study", n_slices=8)
    shutil.copy(paths[2], tmp_path / "study" / "copy-of-3.dcm")  # an exact copy: dropped
    assert len(load_series(discover_series(tmp_path / "study")[0]).volume.array) == 8
    ds = pydicom.dcmread(paths[7])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = pydicom.dcmread(
        paths[6]
    ).SOPInstanceUID
    ds.save_as(paths[7], enforce_file_format=True)
    with pytest.raises(StudyError) as info:
        discover_series(tmp_path / "study")
    assert info.value.code == "instance_invalid"
    assert "carry one SOP Instance UID but differ in position" in info.value.message
    assert f"(SOP Instance UID {ds.SOPInstanceUID})" in info.value.message
    assert paths[7].name not in info.value.message  # the sender's file name: never said


def test_an_image_without_rows_is_named_so(tmp_path: Path) -> None:
    """Found by tools/edge_probe.py: a CT slice without Rows was "not an image (CT Image
    Storage)"."""
    import pydicom

    for path in make_ct_series(tmp_path, n_slices=3):
        ds = pydicom.dcmread(path)
        del ds.Rows
        ds.save_as(path, enforce_file_format=True)
    with pytest.raises(StudyError, match=r"3× CT Image Storage without a usable Rows\)"):
        discover_series(tmp_path)


def test_implausible_ct_values_are_refused_naming_the_likely_cause(tmp_path: Path) -> None:
    """Found by tools/edge_probe.py (unsigned_declared_for_signed): signed HU stored with
    Pixel Representation 0 read -1000 as 64,536 HU; the study ran and a model found the
    whole body a lesion. The same pixels declared signed load as they are."""
    import pydicom

    hu = np.full((4, 8, 8), -1000.0)
    hu[:, 2:6, 2:6] = 40.0
    paths = make_ct_series(tmp_path, n_slices=4, rows=8, cols=8, hu=hu, bits_stored=16,
                           signed=True, rescale=(1.0, 0.0))  # fmt: skip
    (header,) = discover_series(tmp_path)
    assert load_series(header).volume.array.min() == -1000
    for path in paths:
        ds = pydicom.dcmread(path)
        ds.PixelRepresentation = 0
        ds.save_as(path, enforce_file_format=True)
    (header,) = discover_series(tmp_path)
    with pytest.raises(StudyError, match=r"CT values reach 64536 HU \(192 of 256 voxels") as info:
        load_series(header)
    assert info.value.code == "implausible_pixel_values"
    assert "Pixel Representation 0" in info.value.message


def test_no_patient_data_in_logs_or_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uids = _shared_uids()
    make_ct_series(tmp_path, drop=[3], **uids)
    make_localizer(tmp_path, **uids)
    (tmp_path / "notes.txt").write_text("hello")
    caplog.set_level(logging.DEBUG, logger="radserve")
    (header,) = discover_series(tmp_path)
    load_series(header, IngestPolicy(missing_slices="flag"))
    with pytest.raises(GeometryError) as info:
        load_series(header)
    text = caplog.text + str(info.value)
    for keyword in ("PatientName", "PatientID", "PatientBirthDate", "AccessionNumber"):
        assert DEFAULT_PATIENT[keyword] not in text


def test_oversized_series_is_refused_before_allocation(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=3)
    with pytest.raises(StudyError, match="max_voxels") as info:
        load_series(discover_series(tmp_path)[0], IngestPolicy(max_voxels=500))
    assert info.value.code == "series_too_large"


@pytest.mark.parametrize(
    "keyword", ["PatientID", "IssuerOfPatientID", "PatientName", "PatientBirthDate"]
)
def test_a_series_of_two_patients_is_refused_whoever_differs(tmp_path: Path, keyword: str) -> None:
    # session 19: a series whose second half carried another Patient ID ran, its results
    # carrying the first patient's identity over both patients' images
    uids = _shared_uids()
    make_ct_series(tmp_path, n_slices=4, **uids, prefix="a")
    other = {keyword: "19991231" if keyword == "PatientBirthDate" else "OTHER^PATIENT"}
    make_ct_series(tmp_path, n_slices=4, origin=(0.0, 0.0, 8.0), **uids, prefix="b", extra=other)
    (header,) = discover_series(tmp_path)
    assert header.patient_identities == 2
    with pytest.raises(StudyError, match="name 2 different patients") as raised:
        load_series(header)
    assert raised.value.code == "attribute_invalid"
    assert "OTHER" not in str(raised.value) and "1999" not in str(raised.value)


@pytest.mark.parametrize(
    ("keyword", "value", "said"),
    [
        ("PatientID", ["MRN7", "MRN8"], "Patient ID holds 2 values where DICOM allows one"),
        ("PatientName", ["DOE^JANE", "ROE^JO"], "Patient's Name holds 2 values"),
        ("IssuerOfPatientID", ["HOSP", "OTHER"], "Issuer of Patient ID holds 2 values"),
        ("AccessionNumber", ["A1", "A2", "A3"], "Accession Number holds 3 values"),
        ("PatientID", "MRN\x007", "Patient ID holds control characters"),
        ("PatientID", "MRN\t7", "Patient ID holds control characters"),
        ("AccessionNumber", "A\x0b1", "Accession Number holds control characters"),
        ("PatientID", "MRN" + "7" * 62, "Patient ID is 65 characters, more than the 64"),
        ("IssuerOfPatientID", "MRN" + "H" * 70, "Issuer of Patient ID is 73 characters"),
        (
            "AccessionNumber",
            "MRN" + "1" * 14,
            "Accession Number is 17 characters, more than the 16",
        ),
        (
            "PatientID",
            b"MRN7\xff",  # not UTF-8, as the study declares (below)
            "Patient ID holds bytes that are not characters of the study's Specific Char",
        ),
    ],
)
def test_an_identifier_of_several_values_or_with_control_characters_is_refused(
    tmp_path: Path, keyword: str, value: object, said: str
) -> None:
    """Before session 36 a Patient ID ``A\\B`` reached FHIR as one identifier ``A\\B``,
    two Patient's Names one HumanName, and control characters went out as they came.
    Before session 42 an over-long ID went out cut in the SEG/SR and whole in FHIR, and
    bytes the character set lacks as Latin-1 in the SR and U+FFFD in FHIR."""
    if isinstance(value, bytes):
        extra = {keyword: value, "SpecificCharacterSet": "ISO_IR 192"}
    else:
        extra = {keyword: value}
    make_ct_series(tmp_path, n_slices=3, extra=extra)
    (header,) = discover_series(tmp_path)
    with pytest.raises(StudyError, match=said) as raised:
        load_series(header)
    assert raised.value.code == "attribute_invalid"
    assert "MRN" not in str(raised.value) and "DOE" not in str(raised.value)


def test_identifiers_at_their_limits_and_in_their_character_set_are_taken(
    tmp_path: Path,
) -> None:
    extra = {
        "SpecificCharacterSet": "ISO_IR 192",
        "PatientID": "M" * 64,
        "AccessionNumber": "A" * 16,
        "PatientName": "Müller^Jürgen",
    }
    make_ct_series(tmp_path, n_slices=3, extra=extra)
    (header,) = discover_series(tmp_path)
    assert load_series(header).volume.shape[0] == 3


def test_one_patient_in_every_instance_is_one_identity(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=4, **_shared_uids())
    (header,) = discover_series(tmp_path)
    assert header.patient_identities == 1
    assert load_series(header).volume.shape[0] == 4


@pytest.mark.parametrize(
    "other",
    [
        {"orientation": (0.0, 1.0, 0.0, -1.0, 0.0, 0.0)},  # turned 90 degrees in-plane
        {"spacing": (4.0, 0.5, 0.5)},
        {"rows": 8, "cols": 8},
    ],
)
def test_other_images_between_the_slices_are_not_split_off(
    tmp_path: Path, other: dict[str, object]
) -> None:
    # session 19: every other slice of a 12-slice CT turned 90 degrees in its plane (same
    # slice normal), or with other Pixel Spacing or Rows/Columns, was split off, and the
    # other 6 ran at twice the spacing: a result from half a series (liver_lesion 0.19 ml
    # where the whole finds 0.26), whichever half was the larger
    uids = _shared_uids()
    make_ct_series(tmp_path, n_slices=4, spacing=(4.0, 0.7, 0.9), **uids, prefix="a")
    grid = {"spacing": (4.0, 0.7, 0.9), **other}
    make_ct_series(tmp_path, n_slices=4, origin=(0.0, 0.0, 2.0), **uids, prefix="b", **grid)
    parts = discover_series(tmp_path)
    assert [p.number_of_instances for p in parts] == [4, 4]
    policy = IngestPolicy(mixed_orientation="split", mismatched_dimensions="split")
    for part in parts:
        assert "interleaved" in part.split_reasons
        with pytest.raises(GeometryError, match="series interleaves images of another"):
            load_series(part, policy)


def test_a_turned_stack_beyond_the_slices_is_still_split_off(tmp_path: Path) -> None:
    uids = _shared_uids()
    turned = (0.0, 1.0, 0.0, -1.0, 0.0, 0.0)
    make_ct_series(tmp_path, n_slices=5, **uids, prefix="a")
    make_ct_series(
        tmp_path, n_slices=4, orientation=turned, origin=(0.0, 0.0, 40.0), **uids, prefix="b"
    )
    main, other = discover_series(tmp_path)
    assert main.split_reasons == {"orientation"} and other.split_reasons == {"orientation"}
    assert load_series(main).volume.shape[0] == 5


def test_a_name_spelled_with_trailing_empty_components_is_the_same_patient(
    tmp_path: Path,
) -> None:
    # PS3.5 6.2: trailing component and group delimiters may be present or omitted
    uids = _shared_uids()
    make_ct_series(tmp_path, n_slices=4, **uids, prefix="a", extra={"PatientName": "DOE^JOHN"})
    make_ct_series(
        tmp_path,
        n_slices=4,
        origin=(0.0, 0.0, 8.0),
        **uids,
        prefix="b",
        extra={"PatientName": "DOE^JOHN^^^="},
    )
    (header,) = discover_series(tmp_path)
    assert header.patient_identities == 1
    assert load_series(header).volume.shape[0] == 8


def _edited(paths: list[Path], change) -> None:  # type: ignore[no-untyped-def]
    import pydicom

    for path in paths:
        ds = pydicom.dcmread(path)
        change(ds)
        ds.save_as(path, enforce_file_format=True)


def _modality_lut(ds) -> None:  # type: ignore[no-untyped-def]
    from pydicom.dataset import Dataset

    item = Dataset()
    item.LUTDescriptor = [4096, 0, 16]
    table = np.arange(4096) - 1024
    item.add_new(0x00283006, "US", table.astype("<i2").view("<u2").tolist())
    ds.ModalityLUTSequence = [item]
    del ds.RescaleSlope, ds.RescaleIntercept


def _no_rescale(ds) -> None:  # type: ignore[no-untyped-def]
    del ds.RescaleSlope, ds.RescaleIntercept


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (_modality_lut, "instance_invalid", r"a Modality LUT Sequence \(0028,3000\)"),
        (_no_rescale, "instance_invalid", r"CT Image without Rescale Slope and Intercept"),
        (
            lambda ds: setattr(ds, "Modality", "MR"),
            "instance_invalid",
            r"Modality MR contradicts the SOP Class CT Image Storage, whose images are CT",
        ),
        (
            lambda ds: setattr(ds, "SOPClassUID", "1.2.840.10008.5.1.4.1.1.4"),
            "instance_invalid",
            r"Modality CT contradicts the SOP Class MR Image Storage, whose images are MR",
        ),
    ],
)
def test_stored_values_that_would_be_read_as_other_values_are_refused(
    tmp_path: Path, change, code: str, words: str
) -> None:  # type: ignore[no-untyped-def]
    """Found by tools/edge_probe.py (round 4): a CT whose Rescale was replaced by a Modality
    LUT Sequence, or had none, ran with its stored values as HU (1,024 too high) and the
    test model found an 816-voxel "lesion", the body; an instance whose Modality and SOP
    Class disagree ran as whichever the pipeline asked for."""
    paths = make_ct_series(tmp_path, n_slices=4, rows=8, cols=8)
    _edited(paths, change)
    (header,) = discover_series(tmp_path)
    with pytest.raises(StudyError, match=words) as info:
        load_series(header)
    assert info.value.code == code


def test_a_ct_with_its_rescale_and_an_mr_without_load(tmp_path: Path) -> None:
    make_ct_series(tmp_path / "ct", n_slices=4, rows=8, cols=8)
    make_mr_series(tmp_path / "mr", n_slices=4, rows=8, cols=8)
    for folder in ("ct", "mr"):
        (header,) = discover_series(tmp_path / folder)
        assert load_series(header).volume.array.shape == (4, 8, 8)


# --- lossy compression (hostile-input round 5, session 21) ---------------------------------
def test_lossy_compressed_images_run_with_a_warning_saying_so(tmp_path: Path) -> None:
    """A CT lossy compressed (Lossy Image Compression 01 or a lossy-only transfer syntax)
    ran without a word, and its findings differed: the probe's 10:1 JPEG 2000 study found
    the lesion at 0.15 ml against 0.27 ml. It still runs (a lossy study is a valid study;
    archives keep many so) and the report says so, naming the method and the ratio."""
    lossy = {"LossyImageCompression": "01", "LossyImageCompressionMethod": "ISO_15444_1",
             "LossyImageCompressionRatio": "10"}  # fmt: skip
    make_ct_series(tmp_path / "j2k", rows=32, cols=32, transfer_syntax="1.2.840.10008.1.2.4.91",
                   encode_options={"j2k_cr": [10]}, extra=lossy)  # fmt: skip
    (warning,) = [w for w in load_series(discover_series(tmp_path / "j2k")[0]).warnings
                  if "lossy" in w]  # fmt: skip
    assert warning.startswith("8 of 8 images were lossy compressed (Lossy Image Compression "
                              "01, JPEG 2000; ratio up to 10:1)")  # fmt: skip
    as_jpeg_baseline(make_ct_series(tmp_path / "jpeg", rows=32, cols=32), quality=90)
    warnings = load_series(discover_series(tmp_path / "jpeg")[0]).warnings
    assert any("(JPEG Baseline transfer syntax)" in w for w in warnings), warnings
    exact = make_ct_series(tmp_path / "exact", rows=32, cols=32,
                           transfer_syntax="1.2.840.10008.1.2.4.90")  # fmt: skip
    assert exact
    assert not [w for w in load_series(discover_series(tmp_path / "exact")[0]).warnings
                if "lossy" in w]  # fmt: skip


def test_ingest_lossy_input_refuse_fails_a_lossy_study_and_runs_an_exact_one(
    tmp_path: Path,
) -> None:
    """A site whose models were validated on original images only refuses lossy ones
    (`ingest.lossy_input: refuse`); the default flags them (above)."""
    refuse = IngestPolicy(lossy_input="refuse")
    lossy = {"LossyImageCompression": "01", "LossyImageCompressionMethod": "ISO_15444_1"}
    make_ct_series(tmp_path / "j2k", rows=32, cols=32, transfer_syntax="1.2.840.10008.1.2.4.91",
                   encode_options={"j2k_cr": [10]}, extra=lossy)  # fmt: skip
    with pytest.raises(StudyError, match=r"ingest\.lossy_input is 'refuse'") as caught:
        load_series(discover_series(tmp_path / "j2k")[0], refuse)
    assert caught.value.code == "lossy_input"
    make_ct_series(tmp_path / "exact", rows=32, cols=32)
    assert load_series(discover_series(tmp_path / "exact")[0], refuse).volume.shape[0] == 8
