"""SUVbw from PET headers (radserve.ingest.suv), against values computed by hand here."""

from __future__ import annotations

import math

import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from radserve.ingest.suv import SuvConversionError, suv_factors

# 75 kg, 370 MBq F-18 injected at 09:00:00, series at 10:00:00 (3600 s of decay).
WEIGHT_G = 75_000.0
DOSE = 370e6
HALF_LIFE = 6586.2
HAND_START = WEIGHT_G / (DOSE * math.pow(2.0, -3600.0 / HALF_LIFE))  # = 2.9608e-4


def header(**overrides: object) -> Dataset:
    ds = Dataset()
    ds.Modality = "PT"
    ds.Units = "BQML"
    ds.DecayCorrection = "START"
    ds.CorrectedImage = ["DECY", "ATTN", "SCAT"]
    ds.PatientWeight = "75"
    ds.SeriesDate, ds.SeriesTime = "20250102", "100000"
    ds.AcquisitionDate, ds.AcquisitionTime = "20250102", "100000"
    item = Dataset()
    item.RadionuclideTotalDose = "370000000"
    item.RadionuclideHalfLife = "6586.2"
    item.RadiopharmaceuticalStartDateTime = "20250102090000"
    ds.RadiopharmaceuticalInformationSequence = Sequence([item])
    for key, value in overrides.items():
        if value is None:
            delattr(ds, key)
        else:
            setattr(ds, key, value)
    return ds


def _item(ds: Dataset) -> Dataset:
    return ds.RadiopharmaceuticalInformationSequence[0]


def test_bqml_start_decays_the_dose_from_injection_to_the_series_start():
    factors = suv_factors([header(), header()])
    assert factors.factors == pytest.approx((HAND_START, HAND_START), rel=1e-12)
    assert pytest.approx(2.9608e-4, rel=1e-4) == HAND_START
    # 1 SUV at 10:00 is 370 MBq x 2^(-3600/6586.2) / 75 kg = 3377.5 Bq/ml
    assert 3377.5 * factors.factors[0] == pytest.approx(1.0, rel=1e-4)
    assert "3600 s" in factors.rule


def test_injection_time_without_a_datetime_uses_the_series_date():
    ds = header()
    del _item(ds).RadiopharmaceuticalStartDateTime
    _item(ds).RadiopharmaceuticalStartTime = "090000.00"
    assert suv_factors([ds]).factors[0] == pytest.approx(HAND_START, rel=1e-12)


def test_admin_decay_correction_uses_the_undecayed_dose():
    factors = suv_factors([header(DecayCorrection="ADMIN")])
    assert factors.factors[0] == pytest.approx(WEIGHT_G / DOSE, rel=1e-12)


def test_a_series_later_than_its_acquisition_decays_to_the_earliest_acquisition():
    # Re-processed series (Series Time 11:00) of an acquisition that started at 10:00.
    early = header(SeriesTime="110000", AcquisitionTime="100000")
    late = header(SeriesTime="110000", AcquisitionTime="100500")
    factors = suv_factors([late, early])
    assert factors.factors[0] == pytest.approx(HAND_START, rel=1e-12)
    assert "earliest Acquisition" in factors.rule


def test_gml_is_already_suv():
    assert suv_factors([header(Units="GML")]).factors == (1.0,)


def test_philips_counts_with_the_private_suv_scale_factor():
    ds = header(Units="CNTS")
    block = ds.private_block(0x7053, "Philips PET Private Group", create=True)
    block.add_new(0x00, "DS", "0.000512")
    assert suv_factors([ds]).factors == (pytest.approx(0.000512),)


def test_philips_counts_with_the_activity_concentration_scale_factor():
    ds = header(Units="CNTS")
    block = ds.private_block(0x7053, "Philips PET Private Group", create=True)
    block.add_new(0x09, "DS", "2.5")  # Bq/ml per count
    assert suv_factors([ds]).factors[0] == pytest.approx(2.5 * HAND_START, rel=1e-12)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"Units": "CNTS"}, r"CNTS and the Philips private SUV Scale Factor \(7053,1000\)"),
        ({"PatientWeight": None}, r"Patient Weight \(0010,1030\) is missing"),
        ({"PatientWeight": "0"}, r"Patient Weight \(0010,1030\) is not a positive number"),
        ({"DecayCorrection": "NONE"}, r"Decay Correction \(0054,1102\) is NONE"),
        ({"CorrectedImage": ["ATTN"]}, r"Corrected Image \(0028,0051\) lacks \['DECY'\]"),
        ({"Units": None}, r"Units \(0054,1001\) is missing"),
        ({"Units": "PROPCPS"}, r"Units \(0054,1001\) is PROPCPS"),
        ({"Modality": "CT"}, r"modality CT, not PT"),
        ({"RadiopharmaceuticalInformationSequence": None}, r"Radiopharmaceutical Information"),
        ({"SeriesTime": "083000", "AcquisitionTime": "083000"}, r"injection time is 1800 s after"),
    ],
)
def test_what_cannot_be_converted_is_refused_with_the_attribute_named(change, message):
    with pytest.raises(SuvConversionError, match=message):
        suv_factors([header(**change)])


def test_missing_dose_or_half_life_or_injection_time_is_named():
    for keyword, message in (
        ("RadionuclideTotalDose", r"Radionuclide Total Dose \(0018,1074\) is missing"),
        ("RadionuclideHalfLife", r"Radionuclide Half Life \(0018,1075\) is missing"),
        ("RadiopharmaceuticalStartDateTime", r"injection time is missing"),
    ):
        ds = header()
        delattr(_item(ds), keyword)
        with pytest.raises(SuvConversionError, match=message):
            suv_factors([ds])


# --- values no patient or injection has (hostile-input round 5, session 21) -----------------
@pytest.mark.parametrize(
    ("weight", "message"),
    [
        ("75000", r"Patient Weight \(0010,1030\) is above the plausible 0.5-350 kg"),  # grams
        ("500", r"above the plausible 0.5-350 kg"),
        ("0.2", r"below the plausible 0.5-350 kg"),
    ],
)
def test_a_weight_no_patient_has_is_refused_never_quoted(weight, message):
    with pytest.raises(SuvConversionError, match=message) as caught:
        suv_factors([header(PatientWeight=weight)])
    assert weight not in str(caught.value)


@pytest.mark.parametrize(
    ("dose", "side"),
    [("370", "below"), ("10", "below"), ("3.7e11", "above")],  # MBq, mCi, 370 GBq
)
def test_an_injected_dose_in_another_unit_is_refused(dose, side):
    ds = header()
    _item(ds).RadionuclideTotalDose = dose
    with pytest.raises(SuvConversionError, match=rf"Total Dose \(0018,1074\) is {side} the"):
        suv_factors([ds])


@pytest.mark.parametrize(
    ("change", "half_lives"),
    [
        ({"RadionuclideHalfLife": "109.77"}, "32.8"),  # F-18's half-life in minutes
        ({"RadiopharmaceuticalStartDateTime": "20250101090000"}, "13.7"),  # a day early
    ],
)
def test_a_decay_of_more_than_ten_half_lives_is_refused(change, half_lives):
    ds = header()
    for keyword, value in change.items():
        setattr(_item(ds), keyword, value)
    with pytest.raises(SuvConversionError, match=rf"decayed {half_lives} half-lives"):
        suv_factors([ds])


def _time_only(injection: str, series_date: str, series_time: str) -> Dataset:
    ds = header(SeriesDate=series_date, SeriesTime=series_time)
    ds.AcquisitionDate, ds.AcquisitionTime = series_date, series_time
    del _item(ds).RadiopharmaceuticalStartDateTime
    _item(ds).RadiopharmaceuticalStartTime = injection
    return ds


def test_an_injection_before_midnight_given_as_a_time_only_is_dated_the_day_before():
    factors = suv_factors([_time_only("233000", "20250103", "003000")])
    assert factors.factors[0] == pytest.approx(HAND_START, rel=1e-12)  # 3600 s of decay
    assert "taken on the day before the Series Date" in factors.rule


@pytest.mark.parametrize(
    "ds",
    [
        _time_only("100500", "20250102", "100000"),  # 5 min after: a typing error, not a day
        header(SeriesDate="20250103", SeriesTime="003000", AcquisitionTime="003000"),
    ],
    ids=["time_only_minutes_after", "datetime_after"],
)
def test_an_injection_after_the_scan_start_stays_refused(ds):
    if "RadiopharmaceuticalStartDateTime" in _item(ds):
        _item(ds).RadiopharmaceuticalStartDateTime = "20250103233000"
    with pytest.raises(SuvConversionError, match=r"after the scan start|half-lives"):
        suv_factors([ds])


@pytest.mark.parametrize(
    ("keyword", "value", "named"),
    [
        ("DecayCorrection", "ADMIN", r"Decay Correction \(0054,1102\)"),
        ("Units", "CNTS", r"Units \(0054,1001\)"),
        ("PatientWeight", "80", r"Patient Weight \(0010,1030\)"),
        ("RadionuclideTotalDose", "400000000", r"Radionuclide Total Dose \(0018,1074\)"),
    ],
)
def test_instances_that_disagree_on_what_the_factor_comes_from_are_refused(keyword, value, named):
    """Only the first instance's values were read: half a series decay-corrected to the
    injection (ADMIN) got the START factor, about 1.46 times too high an SUV."""
    last = header()
    setattr(_item(last) if keyword == "RadionuclideTotalDose" else last, keyword, value)
    with pytest.raises(SuvConversionError, match=rf"disagree on {named} \(instance 3 of 3"):
        suv_factors([header(), header(), last])
