"""PET activity to body-weight SUV (SUVbw), by the QIBA vendor-neutral rule.

``SUVbw = activity [Bq/ml] x weight [g] / dose [Bq]``, the dose decayed from injection
to the time the activity is decay-corrected to:

- Units ``BQML`` with Decay Correction ``START`` (the usual case): to the scan start,
  Series Date/Time; where the series is later than the earliest Acquisition Date/Time
  (a re-processed series), the GE private scan start (0009,100D) when present, else the
  earliest acquisition. Injection: Radiopharmaceutical Start DateTime (0018,1078), else
  Series Date + Radiopharmaceutical Start Time (0018,1072).
- Decay Correction ``ADMIN``: the activity is already corrected to the injection, so the
  injected dose is used undecayed.
- Units ``CNTS`` (Philips): the private SUV Scale Factor (7053,1000) per instance, or the
  Activity Concentration Scale Factor (7053,1009) to Bq/ml and then the rule above.
- Units ``GML``: already SUVbw.

Anything else is refused with the missing or unusable attribute named (weight, dose,
half-life, injection time, Units, Decay Correction ``NONE``, Corrected Image without
``ATTN``/``DECY``, CNTS without a Philips factor): an SUV guessed is worse than none.
So is a value no patient or injection has, which scales every SUV by the same mistake:
a Patient's Weight outside :data:`WEIGHT_KG` (grams written as kg), an injected dose
outside :data:`DOSE_BQ` (MBq or mCi written as Bq), a decay of more than
:data:`MAX_DECAY_HALF_LIVES` half-lives from injection to the scan start (a wrong date, a
half-life in minutes), and instances of one series that disagree on any of the
attributes the factor comes from (:data:`SERIES_ATTRIBUTES`; only the first instance's
were read). An injection given as a time of day only (no Radiopharmaceutical Start
DateTime) that is later than the scan start's is taken on the day before (a study across
midnight), when that puts it at most :data:`MIDNIGHT_WINDOW_S` before the scan.
The pixel values are already ``stored x RescaleSlope + RescaleIntercept`` per slice
(:mod:`radserve.ingest.decode`); this module only reads headers.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pydicom
from pydicom.dataset import Dataset

from radserve.domain.volume import Volume
from radserve.errors import StudyError
from radserve.ingest.load import LoadedSeries
from radserve.ingest.sources import SourceFile, SourceReader

logger = logging.getLogger(__name__)

_PHILIPS_CREATOR = "Philips PET Private Group"
_PHILIPS_SUV = 0x00  # (7053,xx00) SUV Scale Factor
_PHILIPS_BQML = 0x09  # (7053,xx09) Activity Concentration Scale Factor
_GE_CREATOR = "GEMS_PETD_01"
_GE_SCAN_START = 0x0D  # (0009,xx0D) scan date/time

# A neonate to past any PET table's load limit (about 227-300 kg): outside, the weight is
# in another unit (75,000: grams) or not the patient's.
WEIGHT_KG = (0.5, 350.0)
# 1 MBq (below any clinical or preclinical injection) to 20 GBq (above the largest, Rb-82
# and O-15 water, about 2-3 GBq): 370 is MBq written as Bq, 10 is mCi.
DOSE_BQ = (1e6, 2e10)
# After 10 half-lives 1/1024 of the dose is left: no protocol images so late (F-18: 18 h;
# delayed imaging is 2-3 half-lives); a half-life in minutes (109.77 for F-18) or a wrong
# injection date makes it so.
MAX_DECAY_HALF_LIVES = 10.0
MIDNIGHT_WINDOW_S = 12 * 3600.0
# What the SUV factor is computed from, read from the first instance: every instance of
# the series must agree (Acquisition Date/Time may differ per bed position).
SERIES_ATTRIBUTES = (
    ("Units", "(0054,1001)"),
    ("DecayCorrection", "(0054,1102)"),
    ("CorrectedImage", "(0028,0051)"),
    ("PatientWeight", "(0010,1030)"),
    ("SeriesDate", "(0008,0021)"),
    ("SeriesTime", "(0008,0031)"),
)
RADIOPHARMACEUTICAL_ATTRIBUTES = (
    ("RadionuclideTotalDose", "(0018,1074)"),
    ("RadionuclideHalfLife", "(0018,1075)"),
    ("RadiopharmaceuticalStartDateTime", "(0018,1078)"),
    ("RadiopharmaceuticalStartTime", "(0018,1072)"),
)


class SuvConversionError(StudyError):
    """A PET series whose headers do not allow a trustworthy SUV."""

    code = "suv_unavailable"
    depends_on_model = True  # asked for by a model that takes a PET channel


@dataclass(frozen=True)
class SuvFactors:
    """SUVbw per pixel value, one factor per slice, and the rule that gave them."""

    factors: tuple[float, ...]
    rule: str


def _fail(what: str) -> SuvConversionError:
    return SuvConversionError(f"cannot convert the PET series to SUVbw: {what}")


def _number(
    ds: Dataset,
    keyword: str,
    tag: str,
    *,
    positive: bool = True,
    plausible: tuple[float, float, str] | None = None,
) -> float:
    """The attribute as a number; ``plausible`` (low, high, unit) bounds it: a value
    outside is refused, described by its bounds, never quoted (a weight is patient data)."""
    value = ds.get(keyword)
    try:
        number = float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        number = None
    name = " ".join(_split_camel(keyword))
    if number is None or not np.isfinite(number) or (positive and number <= 0):
        shown = "missing" if value in (None, "") else "not a positive number"
        raise _fail(f"{name} {tag} is {shown}")
    if plausible is not None and not plausible[0] <= number <= plausible[1]:
        low, high, unit = plausible
        side = "below" if number < low else "above"
        raise _fail(
            f"{name} {tag} is {side} the plausible {low:g}-{high:g} {unit}: a value in "
            "another unit or of another patient would scale every SUV by the same mistake"
        )
    return number


def _check_series_agrees(headers: Sequence[Dataset]) -> None:
    """Every instance carries the first one's values of what the factor comes from."""

    def values(ds: Dataset) -> dict[str, str]:
        got = {kw: _text(ds.get(kw)) for kw, _ in SERIES_ATTRIBUTES}
        seq = ds.get("RadiopharmaceuticalInformationSequence") or [Dataset()]
        got.update({kw: _text(seq[0].get(kw)) for kw, _ in RADIOPHARMACEUTICAL_ATTRIBUTES})
        return got

    first = values(headers[0])
    tags = dict(SERIES_ATTRIBUTES + RADIOPHARMACEUTICAL_ATTRIBUTES)
    for index, ds in enumerate(headers[1:], start=1):
        other = values(ds)
        differ = [kw for kw in first if first[kw] != other[kw]]
        if differ:
            named = ", ".join(f"{' '.join(_split_camel(kw))} {tags[kw]}" for kw in differ)
            raise _fail(
                f"the instances of the series disagree on {named} (instance {index + 1} of "
                f"{len(headers)} against the first): one SUV factor cannot hold for both"
            )


def _text(value: object) -> str:
    if isinstance(value, list | tuple | pydicom.multival.MultiValue):
        return "\\".join(str(v).strip() for v in value)
    return "" if value is None else str(value).strip()


def _split_camel(keyword: str) -> list[str]:
    words, word = [], ""
    for ch in keyword:
        if ch.isupper() and word:
            words.append(word)
            word = ""
        word += ch
    return [*words, word]


def _parse_dt(date: str, time: str) -> dt.datetime | None:
    """DA + TM (or a DT in ``date`` with ``time`` empty) -> datetime; None if unusable."""
    text = (date or "").strip() + (time or "").strip()
    text = text.split("+")[0].split("-")[0] if len(text) > 8 else text
    main, _, frac = text.partition(".")
    if len(main) < 12 or not main.isdigit():
        return None
    main = main[:14].ljust(14, "0")
    try:
        when = dt.datetime.strptime(main, "%Y%m%d%H%M%S")
    except ValueError:
        return None
    if frac.isdigit():
        when += dt.timedelta(microseconds=int(frac[:6].ljust(6, "0")))
    return when


def _attr_dt(ds: Dataset, date: str, time: str) -> dt.datetime | None:
    return _parse_dt(str(ds.get(date, "") or ""), str(ds.get(time, "") or ""))


def _private(ds: Dataset, group: int, creator: str, element: int) -> object | None:
    try:
        block = ds.private_block(group, creator)
    except KeyError:
        return None
    tag = block.get_tag(element)
    return ds[tag].value if tag in ds else None


def _injection(ds: Dataset, item: Dataset) -> tuple[dt.datetime, bool]:
    """The injection, and whether only its time of day was given (dated by the series)."""
    when = _parse_dt(str(item.get("RadiopharmaceuticalStartDateTime", "") or ""), "")
    if when is not None:
        return when, False
    time = str(item.get("RadiopharmaceuticalStartTime", "") or "")
    when = _parse_dt(str(ds.get("SeriesDate", "") or ""), time) if time else None
    if when is None:
        raise _fail(
            "the injection time is missing: neither Radiopharmaceutical Start DateTime "
            "(0018,1078) nor Radiopharmaceutical Start Time (0018,1072) with a Series Date"
        )
    return when, True


def _scan_start(headers: Sequence[Dataset]) -> tuple[dt.datetime, str]:
    first = headers[0]
    series = _attr_dt(first, "SeriesDate", "SeriesTime")
    if series is None:
        raise _fail("Series Date (0008,0021) / Series Time (0008,0031) are missing")
    acquisitions = [_attr_dt(ds, "AcquisitionDate", "AcquisitionTime") for ds in headers]
    earliest = min((t for t in acquisitions if t is not None), default=None)
    if earliest is None or series <= earliest:
        return series, "Series Date/Time"
    ge = _private(first, 0x0009, _GE_CREATOR, _GE_SCAN_START)
    ge_time = _parse_dt(str(ge), "") if ge else None
    if ge_time is not None:
        return ge_time, "GE scan start (0009,100D), the series being later than its acquisitions"
    return earliest, "the earliest Acquisition Date/Time, the series being later than it"


def _dose_factor(headers: Sequence[Dataset], decay: str) -> tuple[float, str]:
    """Weight [g] / dose [Bq] decayed to the time the activity is corrected to."""
    ds = headers[0]
    weight = _number(ds, "PatientWeight", "(0010,1030)", plausible=(*WEIGHT_KG, "kg"))
    seq = ds.get("RadiopharmaceuticalInformationSequence")
    if not seq:
        raise _fail("the Radiopharmaceutical Information Sequence (0054,0016) is missing")
    item = seq[0]
    dose = _number(item, "RadionuclideTotalDose", "(0018,1074)", plausible=(*DOSE_BQ, "Bq"))
    if decay == "ADMIN":
        return weight * 1000.0 / dose, "decay-corrected to the injection (ADMIN)"
    half_life = _number(item, "RadionuclideHalfLife", "(0018,1075)")
    injected, time_only = _injection(ds, item)
    start, source = _scan_start(headers)
    seconds = (start - injected).total_seconds()
    crossed = ""
    if seconds < 0 and time_only and 0 < seconds + 86400.0 <= MIDNIGHT_WINDOW_S:
        seconds += 86400.0
        crossed = (
            "; the injection's time of day (no Radiopharmaceutical Start DateTime) is later "
            "than the scan start's: taken on the day before the Series Date"
        )
    if seconds < 0:
        raise _fail(
            f"the injection time is {-seconds:.0f} s after the scan start ({source}); "
            "check Radiopharmaceutical Start (Date)Time"
        )
    if seconds > MAX_DECAY_HALF_LIVES * half_life:
        raise _fail(
            f"the dose would have decayed {seconds / half_life:.1f} half-lives (Radionuclide "
            f"Half Life (0018,1075) {half_life:g} s) from injection to the scan start "
            f"({source}), more than {MAX_DECAY_HALF_LIVES:g}: a wrong injection date or "
            "time, or a half-life not in seconds"
        )
    decayed = dose * 2.0 ** (-seconds / half_life)
    rule = f"dose decayed {seconds:.0f} s from injection to the scan start ({source}){crossed}"
    return weight * 1000.0 / decayed, rule


def suv_factors(headers: Sequence[Dataset]) -> SuvFactors:
    """SUVbw per rescaled pixel value for each header (one per volume slice, in order).

    Raises:
        SuvConversionError: naming the attribute that is missing or rules it out.
    """
    if not headers:
        raise _fail("the series has no instances")
    ds = headers[0]
    if str(ds.get("Modality", "")).upper() != "PT":
        raise _fail(f"the series is modality {ds.get('Modality') or 'missing'}, not PT")
    _check_series_agrees(headers)
    units = str(ds.get("Units", "") or "").upper()
    if not units:
        raise _fail("Units (0054,1001) is missing")
    if units == "GML":
        return SuvFactors((1.0,) * len(headers), "Units GML: already SUVbw")
    if units not in ("BQML", "CNTS"):
        raise _fail(f"Units (0054,1001) is {units}; BQML, CNTS (Philips) or GML are converted")
    raw = ds.get("CorrectedImage") or []
    corrected = {str(c).upper() for c in ([raw] if isinstance(raw, str) else raw)}
    missing = sorted({"ATTN", "DECY"} - corrected)
    if missing:
        raise _fail(f"Corrected Image (0028,0051) lacks {missing}: not a quantitative image")
    decay = str(ds.get("DecayCorrection", "") or "").upper()
    if decay not in ("START", "ADMIN"):
        shown = decay or "missing"
        raise _fail(
            f"Decay Correction (0054,1102) is {shown}; START or ADMIN are converted (NONE "
            "would need a per-frame decay correction)"
        )
    if units == "CNTS":
        suv = [_private(h, 0x7053, _PHILIPS_CREATOR, _PHILIPS_SUV) for h in headers]
        if all(v is not None for v in suv):
            factors = tuple(float(v) for v in suv)  # type: ignore[arg-type]
            return SuvFactors(factors, "Units CNTS: Philips SUV Scale Factor (7053,1000)")
        bqml = [_private(h, 0x7053, _PHILIPS_CREATOR, _PHILIPS_BQML) for h in headers]
        if not all(v is not None for v in bqml):
            raise _fail(
                "Units (0054,1001) is CNTS and the Philips private SUV Scale Factor "
                "(7053,1000) and Activity Concentration Scale Factor (7053,1009) are "
                "missing: counts cannot be turned into activity"
            )
        per_ml, rule = _dose_factor(headers, decay)
        factors = tuple(float(v) * per_ml for v in bqml)  # type: ignore[arg-type]
        return SuvFactors(factors, f"Units CNTS via Philips (7053,1009) to Bq/ml; {rule}")
    factor, rule = _dose_factor(headers, decay)
    return SuvFactors((factor,) * len(headers), f"Units BQML; {rule}")


def _read_headers(files: Sequence[SourceFile]) -> list[Dataset]:
    with SourceReader() as reader:
        out = []
        for src in files:
            with reader.open(src) as raw:
                out.append(pydicom.dcmread(raw, stop_before_pixels=True, force=True))
        return out


def series_to_suv(loaded: LoadedSeries) -> tuple[Volume, SuvFactors]:
    """``loaded`` (a PT series in physical units) as float32 SUVbw, and the factors.

    Factors are applied per slice where the slices map to instances; a stack resampled
    on ingest (no such map) is converted only when every instance has one factor.
    """
    if loaded.source_slices:
        headers = _read_headers([s.source for s in loaded.source_slices])
    else:
        headers = _read_headers(loaded.header.files)
    factors = suv_factors(headers)
    values = np.asarray(factors.factors, np.float64)
    if not loaded.source_slices and not np.allclose(values, values[0], rtol=1e-9):
        raise _fail(
            "the slices were resampled on ingest and the instances' SUV factors differ: "
            "they cannot be matched to slices"
        )
    scale = values if loaded.source_slices else np.full(loaded.volume.shape[0], values[0])
    array = loaded.volume.array.astype(np.float32) * scale.astype(np.float32)[:, None, None]
    logger.info("PET to SUVbw: %s", factors.rule)
    return loaded.volume.with_array(array), factors


__all__ = ["SuvConversionError", "SuvFactors", "series_to_suv", "suv_factors"]
