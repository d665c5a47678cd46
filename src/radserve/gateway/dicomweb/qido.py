"""DICOMweb QIDO-RS (PS3.18 10.6) over what radserve holds: the studies, series and
instances of the DICOM results it wrote (SEG, SR, SC key images), found through the
result index, so that a DICOMweb viewer can browse them and retrieve them by WADO-RS.

Received source images are not listed: radserve keeps them to process, not as an
archive, and WADO-RS does not serve them, so a listing would promise what a retrieve
then refuses. A study is listed with the attributes of the source study (the results
are written into it) and counts and modalities of the results alone.

Matching follows PS3.4 C.2.2.2: single value, universal (empty), UID list (``,`` or
``\\``), wildcard ``*``/``?`` on text VRs (case-insensitive for PN, as C.2.2.2.1
allows), date/time ranges ``a-b``, ``a-``, ``-b``, and numbers within their VR's range.
Sequences and bulk data (Pixel Data, OB/OW/...) are no match keys; ``includefield``
takes a sequence (answered as DICOM JSON from the result's header). ``fuzzymatching=true``
is answered by literal matching with a Warning header. Header attributes come from the
files, read once (no Pixel Data) and kept in a bounded cache.

A search without a Study Instance UID reads the index in full, unless it matches an exact
Patient ID or a Study Date (or range): then the index hands only the rows of that
patient's hash and within those dates (:mod:`radserve.store.result_match`), and the
headers of those alone are matched. Rows indexed before those columns (or under another
audit key) get theirs from their headers before the first such search of a process.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydicom.datadict import dictionary_VR, keyword_for_tag, tag_for_keyword
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue

from radserve.errors import InvalidRequestError, quoted
from radserve.ingest.headers import UnreadableHeaderError, read_header
from radserve.store.result_match import MatchBounds, PatientKey, date_bounds, match_columns
from radserve.store.results import ResultIndex, ResultInstanceRecord

Level = Literal["study", "series", "instance"]

MAX_RESULTS = 1000
CACHE_ENTRIES = 20_000

STUDY_ATTRIBUTES = (
    "SpecificCharacterSet",
    "StudyDate",
    "StudyTime",
    "AccessionNumber",
    "ReferringPhysicianName",
    "PatientName",
    "PatientID",
    "IssuerOfPatientID",
    "PatientBirthDate",
    "PatientSex",
    "StudyInstanceUID",
    "StudyID",
    "StudyDescription",
)
SERIES_ATTRIBUTES = (
    "Modality",
    "SeriesDescription",
    "SeriesInstanceUID",
    "SeriesNumber",
    "SeriesDate",
    "SeriesTime",
    "Manufacturer",
    "PerformedProcedureStepStartDate",
    "PerformedProcedureStepStartTime",
)
INSTANCE_ATTRIBUTES = (
    "SOPClassUID",
    "SOPInstanceUID",
    "InstanceNumber",
    "ContentDate",
    "ContentTime",
    "TimezoneOffsetFromUTC",
    "Rows",
    "Columns",
    "BitsAllocated",
    "NumberOfFrames",
)
# computed per level from the index (not read from a header)
STUDY_COMPUTED = (
    "ModalitiesInStudy",
    "NumberOfStudyRelatedSeries",
    "NumberOfStudyRelatedInstances",
)
SERIES_COMPUTED = ("NumberOfSeriesRelatedInstances",)
COMMON_COMPUTED = ("RetrieveURL", "InstanceAvailability")
_READ = STUDY_ATTRIBUTES + SERIES_ATTRIBUTES + INSTANCE_ATTRIBUTES
_LEVEL_ATTRIBUTES: dict[Level, tuple[str, ...]] = {
    "study": STUDY_ATTRIBUTES + STUDY_COMPUTED,
    "series": SERIES_ATTRIBUTES + SERIES_COMPUTED,
    "instance": INSTANCE_ATTRIBUTES,
}
_RANGE_VRS = {"DA", "TM", "DT"}
_TEXT_VRS = {"AE", "CS", "LO", "LT", "PN", "SH", "ST", "UC", "UT", "UR"}
_NUMBER_VRS = {"IS", "DS", "US", "UL", "SS", "SL", "FL", "FD", "UV", "SV"}
# the values a query number of an integer VR may take (PS3.5 6.2: IS is a signed 32-bit
# integer); before, `Rows=99999999999999999999` and `NumberOfFrames=1e999` (or `nan`)
# were searched, answering 200 with nothing, while `NumberOfFrames=abc` was 400
_INTEGER_RANGES = {
    "US": (0, 2**16 - 1),
    "SS": (-(2**15), 2**15 - 1),
    "UL": (0, 2**32 - 1),
    "SL": (-(2**31), 2**31 - 1),
    "UV": (0, 2**64 - 1),
    "SV": (-(2**63), 2**63 - 1),
    "IS": (-(2**31), 2**31 - 1),
}
_FL_MAX = 3.4028234663852886e38  # the largest finite 32-bit float
# no match keys: bulk data (PS3.18 8.3.4: not in a QIDO-RS answer, never read by a
# search: `PixelData=x` answered 200 with nothing), and the item delimiters (VR NONE)
_BULK_VRS = {"OB", "OW", "OF", "OD", "OL", "OV", "UN"}
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_PARAMETERS = {"limit", "offset", "fuzzymatching", "includefield"}
FUZZY_WARNING = (
    '299 radserve: "The fuzzymatching parameter is not supported. '
    'Only literal matching has been performed."'
)
MORE_WARNING = (
    '299 radserve: "The number of results exceeded the maximum supported by the server. '
    'Additional results can be requested."'
)


@dataclass(frozen=True)
class QidoQuery:
    """One search: its level, the UIDs of its path, match keys and paging."""

    level: Level
    study: str | None = None
    series: str | None = None
    filters: dict[str, str] = field(default_factory=dict)
    include: frozenset[str] = frozenset()
    include_all: bool = False
    limit: int | None = None
    offset: int = 0
    fuzzy: bool = False


@dataclass(frozen=True)
class QidoAnswer:
    """The DICOM JSON results, the Warning header values to send with them, and the jobs
    whose results they show (each a read of patient data, to audit)."""

    results: list[dict[str, Any]]
    warnings: list[str]
    job_ids: frozenset[str] = frozenset()


def parse_query(
    items: Iterable[tuple[str, str]],
    level: Level,
    study: str | None = None,
    series: str | None = None,
) -> QidoQuery:
    """A :class:`QidoQuery` from the request's query items; raises
    :class:`InvalidRequestError` (400) for what cannot be searched."""
    filters: dict[str, str] = {}
    include: set[str] = set()
    include_all = False
    limit: int | None = None
    offset = 0
    fuzzy = False
    for key, value in items:
        if key == "limit":
            limit = _count(key, value)
        elif key == "offset":
            offset = _count(key, value)
        elif key == "fuzzymatching":
            if value.lower() not in ("true", "false"):
                raise InvalidRequestError("fuzzymatching must be true or false")
            fuzzy = value.lower() == "true"
        elif key == "includefield":
            for name in filter(None, (v.strip() for v in value.split(","))):
                if name == "all":
                    include_all = True
                else:
                    include.add(_included(name))
        else:
            keyword = _match_key(key)
            if keyword in filters:
                raise InvalidRequestError(f"{keyword} is given more than once")
            _check_value(keyword, value)
            filters[keyword] = value
    return QidoQuery(
        level, study, series, filters, frozenset(include), include_all, limit, offset, fuzzy
    )


def _check_value(keyword: str, value: str) -> None:
    """Refuse (400) a date, time or number the matching could not compare, here, whether
    or not a row is there to compare it with: checked only while matching, a bad value
    answered 200 with no matches from an empty index and 400 from a full one."""
    if value in ("", "*"):
        return
    vr = dictionary_VR(keyword)
    if vr == "UI":
        # UID list matching (PS3.4 C.2.2.2.2): whole UIDs, no wildcards; before, `1.2*`
        # answered 200 with nothing, as if no such study had results
        for uid in re.split(r"[,\\]", value):
            if uid.strip() and not _UID.fullmatch(uid.strip()):
                raise InvalidRequestError(
                    f"{keyword} matches whole UIDs (digits and dots, a list separated by "
                    f"commas), without wildcards: {quoted(value)}"
                )
        return
    if vr == "DT" and _DATETIME.fullmatch(value):
        return  # one date-time, its UTC offset's minus sign no range
    if vr in _RANGE_VRS:
        low, dash, high = value.partition("-")
        if dash and not low and not high:
            raise InvalidRequestError(f"a {vr} range needs at least one end: {quoted(value)}")
        if "-" in high:
            raise InvalidRequestError(f"a {vr} range has one '-': {quoted(value)}")
        for end in filter(None, (low, high)):
            _check_end(vr, end, in_range=bool(dash))
    elif _number_vrs(keyword):
        _number_key(keyword, value)


# PS3.5 6.2: DA YYYYMMDD (YYYY.MM.DD of ACR-NEMA read too), TM HH[MM[SS[.F]]] (HH:MM:SS
# too), DT YYYY[MM[DD[HH[MM[SS[.F]]]]]][&ZZXX]; a range's end may be a date's prefix
# (``2025-``: from 2025 on), a single date may not (it matches no stored date)
_DATE = re.compile(r"\d{4}\.?\d{2}\.?\d{2}")
_DATE_PREFIX = re.compile(r"\d{4}(\.?\d{2}(\.?\d{2})?)?")
_TIME = re.compile(r"\d{2}(:?\d{2}(:?\d{2}(\.\d{1,6})?)?)?")
_DATETIME = re.compile(r"\d{4}(\d{2}(\d{2}(\d{2}(\d{2}(\d{2}(\.\d{1,6})?)?)?)?)?)?([+-]\d{4})?")
_VR_NAMES = {"DA": "date (YYYYMMDD)", "TM": "time (HHMMSS)", "DT": "date-time"}
_UID = re.compile(r"[0-9]+(\.[0-9]+)*")


def _check_end(vr: str, end: str, *, in_range: bool) -> None:
    """One date, time or date-time, or one end of a range: its form, and a date or time
    that is on the calendar or the clock (before session 35 '2024', '99991399' and three
    dates joined by '-' were searched, matching nothing, not refused as documented)."""
    text = end.strip()
    form = {"DA": _DATE_PREFIX if in_range else _DATE, "TM": _TIME, "DT": _DATETIME}[vr]
    if not form.fullmatch(text):
        raise InvalidRequestError(f"not a DICOM {_VR_NAMES[vr]}: {quoted(end)}")
    digits = re.sub(r"[.:]", "", text)
    try:
        if vr in ("DA", "DT") and len(digits) >= 6:
            day = int(digits[6:8]) if len(digits) >= 8 else 1
            dt.date(int(digits[:4]), int(digits[4:6]), day)
        if vr == "TM" and (int(digits[:2]) > 23 or int(digits[2:4] or 0) > 59):
            raise ValueError("no such time")
    except ValueError:
        raise InvalidRequestError(
            f"not a {_VR_NAMES[vr]} on the calendar or clock: {quoted(end)}"
        ) from None


def _count(key: str, value: str) -> int:
    if not value.isdigit() or len(value) > 9:
        raise InvalidRequestError(f"{key} must be a non-negative integer, not {quoted(value)}")
    return int(value)


def _keyword(name: str) -> str:
    """The DICOM keyword of a query key or an ``includefield`` name (a keyword or 8 hex
    digits of a tag); a sequence is included whole (its items as DICOM JSON)."""
    if "." in name:
        raise InvalidRequestError(
            f"{quoted(name)}: radserve does not match or include attributes inside sequences"
        )
    if re.fullmatch(r"[0-9A-Fa-f]{8}", name):
        keyword = keyword_for_tag(int(name, 16))
    else:
        keyword = name if tag_for_keyword(name) is not None else ""
    if keyword and tag_for_keyword(keyword) is None:
        # a repeating group's attribute (60xx Overlay, 50xx Curve, 1010xxxx Zonal Map):
        # pydicom names the tag but has no one tag for the name (found by fuzzing)
        raise InvalidRequestError(
            f"{quoted(name)} is {keyword}, an attribute of a repeating group: radserve does "
            "not match or include it"
        )
    if not keyword:
        raise InvalidRequestError(
            f"{quoted(name)} is not a DICOM attribute keyword or tag, nor a QIDO-RS parameter "
            f"({', '.join(sorted(_PARAMETERS))})"
        )
    return keyword


def _included(name: str) -> str:
    """The keyword of an ``includefield`` name: any attribute but bulk data, which a
    QIDO-RS answer never carries (PS3.18 8.3.4; ``includefield=PixelData`` answered 200
    without it, as if the results had none, until 2026-12-07)."""
    keyword = _keyword(name)
    vr = dictionary_VR(keyword)
    if set(vr.split(" or ")) & _BULK_VRS:
        raise InvalidRequestError(
            f"{keyword} is bulk data (VR {vr}): a QIDO-RS answer does not carry it; "
            "retrieve the instance by WADO-RS"
        )
    return keyword


def _match_key(name: str) -> str:
    """The keyword of a match key: an attribute whose values a search can compare. A
    sequence (until 2026-12-07 refused as ``includefield`` too, with this message) and
    bulk data are not."""
    keyword = _keyword(name)
    vr = dictionary_VR(keyword)
    if vr == "SQ":
        raise InvalidRequestError(
            f"{keyword} is a sequence: radserve does not match on it (includefield="
            f"{keyword} returns it)"
        )
    if vr == "NONE":
        raise InvalidRequestError(
            f"{keyword} is a sequence delimiter, not an attribute: radserve does not match on it"
        )
    if set(vr.split(" or ")) & _BULK_VRS:
        raise InvalidRequestError(
            f"{keyword} is bulk data (VR {vr}): radserve does not match on it; match on "
            "other attributes and retrieve the instance by WADO-RS"
        )
    return keyword


def _number_vrs(keyword: str) -> tuple[str, ...]:
    """The numeric VRs of ``keyword`` (two for ``US or SS``), or () for another VR."""
    vrs = tuple(dictionary_VR(keyword).split(" or "))
    return vrs if all(vr in _NUMBER_VRS for vr in vrs) else ()


def _number_key(keyword: str, value: str) -> float:
    """A number to match ``keyword`` (of a numeric VR) on; raises
    :class:`InvalidRequestError` (400) for what no value of its VR can be: not a decimal
    number (``nan``, ``inf``, ``abc``), not finite (``1e999``), a fraction or a number out
    of range for an integer VR (US 0..65535, UL 0..2^32-1, IS -2^31..2^31-1, ...)."""
    vrs = _number_vrs(keyword)
    names = " or ".join(vrs)
    text = value.strip()
    if not _DECIMAL.fullmatch(text):
        raise InvalidRequestError(f"{keyword} must be a number, not {quoted(value)}")
    number = float(text)
    if all(vr in _INTEGER_RANGES for vr in vrs):
        low = min(_INTEGER_RANGES[vr][0] for vr in vrs)
        high = max(_INTEGER_RANGES[vr][1] for vr in vrs)
        if not _INTEGER.fullmatch(text):
            raise InvalidRequestError(
                f"{keyword} ({names}) must be a whole number, not {quoted(value)}"
            )
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-").lstrip("0") or "0"  # int() reads at most 4,300 digits
        if len(digits) > 20 or not low <= sign * int(digits) <= high:
            raise InvalidRequestError(
                f"{keyword} ({names}) must be from {low} to {high}, not {quoted(value)}"
            )
        return number
    if not math.isfinite(number) or ("FL" in vrs and "FD" not in vrs and abs(number) > _FL_MAX):
        raise InvalidRequestError(
            f"{keyword} ({names}) must be a finite number within its VR's range, not "
            f"{quoted(value)}"
        )
    return number


def _read_indexed(path: str, transfer_syntax: str, tags: list[str]) -> Dataset:
    """``tags`` of an indexed result file: the index row holds its Transfer Syntax (read
    from the file when it was indexed), so the File Meta is not parsed a second time to
    tell whether the file is Deflated before pydicom parses it."""
    return read_header(path, tags=tags, transfer_syntax=transfer_syntax or None)


class _HeaderCache:
    """Small headers of result files (the attributes QIDO reads), by path; bounded LRU."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self._entries = entries
        self._cache: OrderedDict[str, Dataset] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, record: ResultInstanceRecord) -> Dataset:
        path = record.path
        with self._lock:
            found = self._cache.get(path)
            if found is not None:
                self._cache.move_to_end(path)
                return found
        header = _read_indexed(path, record.transfer_syntax_uid, list(_READ))
        with self._lock:
            self._cache[path] = header
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return header


@dataclass
class _Row:
    """One result at the query's level: its representative header, its instances."""

    header: Dataset
    records: list[ResultInstanceRecord]
    computed: Dataset


class QidoSearch:
    """QIDO-RS searches over the result index; synchronous (call from a worker thread)."""

    def __init__(self, index: ResultIndex, *, max_results: int = MAX_RESULTS) -> None:
        self.index = index
        self.max_results = max_results
        self._headers = _HeaderCache()
        self._filled = False  # every row's match columns made with this process's key
        self._fill_lock = threading.Lock()

    def search(
        self, query: QidoQuery, base_url: str, visible: Callable[[str], bool] | None = None
    ) -> QidoAnswer:
        """The results of ``query``; ``base_url`` is the DICOMweb root for RetrieveURL;
        ``visible(job_id)`` hides the results of jobs the caller may not see (the same
        rule as every other read)."""
        seen: dict[str, bool] = {}

        def shown(record: ResultInstanceRecord) -> bool:
            if visible is None:
                return True
            if record.job_id not in seen:
                seen[record.job_id] = visible(record.job_id)
            return seen[record.job_id]

        records = [
            r
            for r in self.index.find(query.study, query.series, bounds=self._bounds(query))
            if shown(r) and Path(r.path).is_file()
        ]
        rows = self._rows(records, query.level, base_url.rstrip("/"))
        filters = query.filters.items()
        matched = [row for row in rows if all(self._match(row, k, v) for k, v in filters)]
        _sort(matched, query.level)
        warnings = [FUZZY_WARNING] if query.fuzzy else []
        limit = self.max_results if query.limit is None else min(query.limit, self.max_results)
        if query.limit == 0:
            limit = self.max_results
        page = matched[query.offset : query.offset + limit]
        if len(matched) > query.offset + limit and (
            query.limit is None or query.limit == 0 or query.limit > self.max_results
        ):
            warnings.append(MORE_WARNING)
        jobs = frozenset(r.job_id for row in page for r in row.records)
        return QidoAnswer([self._json(row, query) for row in page], warnings, jobs)

    # --- index bounds --------------------------------------------------------------------
    def _bounds(self, query: QidoQuery) -> MatchBounds | None:
        """What the index narrows a search without a study by: an exact PatientID (no
        wildcard, no list), a StudyDate or range; None: the index is read whole."""
        key = self.index.patient_key
        if query.study is not None or key is None:
            return None
        patient = query.filters.get("PatientID", "")
        exact = patient not in ("", "*") and not any(c in patient for c in "*?\\")
        bounds = MatchBounds(
            key.of(patient) if exact else None, *date_bounds(query.filters.get("StudyDate", ""))
        )
        if not bounds.any:
            return None
        self._fill(key)
        return bounds

    def _fill(self, key: PatientKey) -> None:
        """Give the rows without match columns of ``key`` theirs, from their headers: all
        such rows the first time in this process (indexed before the columns, or under
        another audit key), then those indexed since without a key (an indexed lookup)."""
        with self._fill_lock:
            rows = self.index.unmatched(key.id, only_unset=self._filled)
            filled = []
            for sop, path, syntax in rows:
                try:
                    header = _read_indexed(path, syntax, ["PatientID", "StudyDate"])
                except (OSError, UnreadableHeaderError):
                    header = Dataset()  # gone or unreadable: no search can show it
                filled.append((sop, *match_columns(header, key)))
            self.index.fill_match(filled, key.id)
            self._filled = True

    # --- rows ----------------------------------------------------------------------------
    def _rows(self, records: Sequence[ResultInstanceRecord], level: Level, base: str) -> list[_Row]:
        groups: dict[tuple[str, ...], list[ResultInstanceRecord]] = {}
        for record in records:
            key: tuple[str, ...] = (record.study_instance_uid,)
            if level != "study":
                key += (record.series_instance_uid,)
            if level == "instance":
                key += (record.sop_instance_uid,)
            groups.setdefault(key, []).append(record)
        by_study: dict[str, list[ResultInstanceRecord]] = {}
        for record in records:
            by_study.setdefault(record.study_instance_uid, []).append(record)
        rows = []
        for key, members in groups.items():
            header = self._headers.get(members[0])
            computed = Dataset()
            url = f"{base}/studies/{key[0]}"
            if level == "study":
                modalities = sorted(
                    {str(self._headers.get(r).get("Modality", "")) for r in members} - {""}
                )
                computed.ModalitiesInStudy = modalities
                computed.NumberOfStudyRelatedSeries = len({r.series_instance_uid for r in members})
                computed.NumberOfStudyRelatedInstances = len(members)
            else:
                url += f"/series/{key[1]}"
            if level == "series":
                computed.NumberOfSeriesRelatedInstances = len(members)
            if level == "instance":
                url += f"/instances/{key[2]}"
            computed.RetrieveURL = url
            computed.InstanceAvailability = "ONLINE"
            rows.append(_Row(header, members, computed))
        return rows

    def _element(self, row: _Row, keyword: str) -> Any:
        """The row's value of ``keyword`` (computed, cached header, or read on demand)."""
        for source in (row.computed, row.header):
            if keyword in source:
                return source[keyword]
        record = row.records[0]
        header = _read_indexed(record.path, record.transfer_syntax_uid, [keyword])
        # the element, as from the sources above: ``get`` of a keyword answers its value
        # (an attribute outside _READ, a sequence above all, was a 500 to include or match)
        return header.get(tag_for_keyword(keyword))

    # --- matching (PS3.4 C.2.2.2) ---------------------------------------------------------
    def _match(self, row: _Row, keyword: str, wanted: str) -> bool:
        if wanted == "" or wanted == "*":
            return True  # universal matching: the element is not even read
        return matches(_values(self._element(row, keyword)), keyword, wanted)

    # --- output ---------------------------------------------------------------------------
    def _json(self, row: _Row, query: QidoQuery) -> dict[str, Any]:
        keywords = list(_LEVEL_ATTRIBUTES[query.level])
        if query.level == "instance" and query.series is None:
            keywords += SERIES_ATTRIBUTES
        if query.level != "study":
            keywords += ("StudyInstanceUID",)
            if query.study is None:
                keywords += STUDY_ATTRIBUTES
            if query.level == "instance" and query.series is not None:
                keywords += ("SeriesInstanceUID",)
        if query.include_all:
            keywords += _READ
        keywords += (*COMMON_COMPUTED, *sorted(query.include), *query.filters)
        out = Dataset()
        for keyword in dict.fromkeys(keywords):
            element = self._element(row, keyword)
            if element is not None:
                out[element.tag] = element
        return out.to_json_dict()


def _values(element: Any) -> list[str]:
    if element is None or element.value is None or element.value == "":
        return []
    value = element.value
    items = list(value) if isinstance(value, MultiValue | list) else [value]
    return [str(v) for v in items]


def matches(values: Sequence[str], keyword: str, wanted: str) -> bool:
    """Whether any of an attribute's ``values`` matches the query value ``wanted`` (PS3.4
    C.2.2.2; ``keyword`` decides how); raises :class:`InvalidRequestError` for a value
    that cannot be compared."""
    if wanted == "" or wanted == "*":
        return True  # universal matching
    vr = dictionary_VR(keyword)
    if vr == "UI" or keyword == "ModalitiesInStudy":
        keys = {v.strip() for v in re.split(r"[,\\]", wanted) if v.strip()}
        return any(v in keys for v in values)
    if vr in _RANGE_VRS:
        return any(_in_range(v, wanted, vr) for v in values)
    if _number_vrs(keyword):
        target = _number_key(keyword, wanted)
        return any(_number(v) == target for v in values)
    fold = vr == "PN"  # case-insensitive for person names (C.2.2.2.1 allows it)
    return any(wildcard_match(wanted, v, ignore_case=fold) for v in values)


def wildcard_match(pattern: str, text: str, *, ignore_case: bool = False) -> bool:
    """Whether all of ``text`` matches ``pattern`` (``*`` any run, ``?`` one character).

    In time proportional to len(pattern) x len(text) whatever the pattern: a regular
    expression of ``.*`` per ``*`` backtracks exponentially (``*a*a*a*a*a*a*a*a*a*a*b``
    against 40 characters of ``a`` ran for minutes in one QIDO-RS search). The classic
    greedy matcher: a later ``*`` makes any earlier one's choice final."""
    if ignore_case:
        pattern, text = pattern.casefold(), text.casefold()
    p = t = 0
    star, resume = -1, 0  # the last '*' seen, and where in text it was tried to end
    while t < len(text):
        if p < len(pattern) and pattern[p] in ("?", text[t]) and pattern[p] != "*":
            p, t = p + 1, t + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, resume, p = p, t, p + 1
        elif star >= 0:
            resume += 1
            p, t = star + 1, resume
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def _in_range(value: str, wanted: str, vr: str) -> bool:
    low, dash, high = wanted.partition("-")
    if vr == "DT" and _DATETIME.fullmatch(wanted):  # a minus sign of a UTC offset
        low, dash, high = wanted, "", ""
    norm = _time if vr == "TM" else _date
    if not dash:
        return norm(value) == norm(low)
    if not low and not high:
        raise InvalidRequestError(f"a {vr} range needs at least one end: {quoted(wanted)}")
    if low and norm(value) < norm(low):
        return False
    # an open or shorter upper end covers everything it is a prefix of (e.g. a date's day)
    return not high or norm(value)[: len(norm(high))] <= norm(high)


def _date(text: str) -> str:
    cleaned = text.replace(".", "").replace("-", "").strip()
    if cleaned and not cleaned.replace("+", "").isdigit():
        raise InvalidRequestError(f"not a DICOM date/time: {quoted(text)}")
    return cleaned


def _time(text: str) -> str:
    cleaned = text.replace(":", "").strip()
    if cleaned and not re.fullmatch(r"\d{2,6}(\.\d{1,6})?", cleaned):
        raise InvalidRequestError(f"not a DICOM time: {quoted(text)}")
    return cleaned


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _sort(rows: list[_Row], level: Level) -> None:
    """Newest study first (StudyDate, StudyTime), then series and instance numbers."""

    def within(row: _Row) -> tuple[Any, ...]:
        header, record = row.header, row.records[0]
        parts: tuple[Any, ...] = (record.study_instance_uid,)
        if level != "study":
            parts += (_number(str(header.get("SeriesNumber", ""))) or 0.0,)
            parts += (record.series_instance_uid,)
        if level == "instance":
            parts += (_number(str(header.get("InstanceNumber", ""))) or 0.0,)
            parts += (record.sop_instance_uid,)
        return parts

    rows.sort(key=within)
    rows.sort(  # newest study first; a stable sort keeps the order within a study
        key=lambda r: f"{r.header.get('StudyDate', '')}{r.header.get('StudyTime', '')}",
        reverse=True,
    )


__all__ = [
    "FUZZY_WARNING",
    "MORE_WARNING",
    "QidoAnswer",
    "QidoQuery",
    "QidoSearch",
    "matches",
    "parse_query",
    "wildcard_match",
]
