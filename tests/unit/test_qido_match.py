"""QIDO-RS wildcard matching (PS3.4 C.2.2.2.4): ``*`` any run, ``?`` one character, the
whole value matched, in time proportional to pattern x value whatever the pattern."""

from __future__ import annotations

import itertools
import re

import pytest

from radserve.errors import InvalidRequestError
from radserve.gateway.dicomweb.qido import matches, parse_query, wildcard_match


def _by_regex(pattern: str, text: str) -> bool:
    """The translation the matcher replaced (exponential on some patterns, right on all)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None


def _words(alphabet: str, longest: int) -> list[str]:
    return ["".join(w) for n in range(longest + 1) for w in itertools.product(alphabet, repeat=n)]


def test_wildcard_match_agrees_with_the_regular_expression_on_every_short_case() -> None:
    for pattern in _words("ab*?", 4):
        for text in _words("ab", 4):
            assert wildcard_match(pattern, text) == _by_regex(pattern, text), (pattern, text)


def test_a_pattern_that_made_the_regular_expression_backtrack_is_answered() -> None:
    # "*a" x 12 + "b" against 60 x "a": ~10^12 regex backtracking steps; here ~10^3
    assert not wildcard_match("*a" * 12 + "b", "a" * 60)
    assert wildcard_match("*a" * 12 + "b", "a" * 60 + "b")
    assert not wildcard_match("*?" * 30 + "x", "y" * 64)


@pytest.mark.parametrize(
    ("keyword", "wanted", "values", "expected"),
    [
        ("PatientName", "doe^j*", ["DOE^JOHN"], True),  # PN: case-insensitive
        ("StudyDescription", "chest*", ["CHEST CT"], False),  # other text: exact case
        ("StudyDescription", "CHEST*", ["CHEST CT"], True),
        ("StudyInstanceUID", "1.2,1.3", ["1.3"], True),  # UI: a list of UIDs
        ("StudyDate", "20240101-20241231", ["20240615"], True),
        ("StudyDate", "-20231231", ["20240615"], False),
        ("SeriesNumber", "3", ["3"], True),
        ("AccessionNumber", "", [], True),  # universal matching
    ],
)
def test_matches_follows_the_attribute_s_matching_rule(
    keyword: str, wanted: str, values: list[str], expected: bool
) -> None:
    assert matches(values, keyword, wanted) is expected


def test_a_number_key_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="SeriesNumber must be a number"):
        matches(["3"], "SeriesNumber", "three")


@pytest.mark.parametrize("key", ["10100010", "60003000", "50000005"])
def test_a_repeating_group_tag_is_refused_as_a_key(key: str) -> None:
    """Found by fuzzing (tests/fuzz qido target): its keyword has no single tag, and
    pydicom's ValueError escaped the query parser."""
    with pytest.raises(InvalidRequestError, match="repeating group"):
        parse_query([(key, "x")], "study")
    with pytest.raises(InvalidRequestError, match="repeating group"):
        parse_query([("includefield", key)], "study")


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("StudyDate", "2024", "not a DICOM date (YYYYMMDD): '2024'"),
        ("StudyDate", "99991399", "not a date (YYYYMMDD) on the calendar"),
        ("StudyDate", "20240230", "not a date (YYYYMMDD) on the calendar"),
        ("StudyDate", "20240101-20240101-20240101", "has one '-'"),
        ("StudyDate", "a-b", "not a DICOM date"),
        ("StudyDate", "202413-", "on the calendar"),
        ("StudyTime", "250000", "not a time (HHMMSS) on the calendar or clock"),
        ("StudyTime", "12x", "not a DICOM time"),
        ("AcquisitionDateTime", "2024013", "not a DICOM date-time"),
    ],
)
def test_a_date_or_time_no_stored_value_could_match_is_refused(
    key: str, value: str, said: str
) -> None:
    """Before session 35 these were searched and matched nothing (200, an empty list),
    where the conformance statement promises 400 for a malformed date or time."""
    with pytest.raises(InvalidRequestError) as refused:
        parse_query([(key, value)], "study")
    assert said in refused.value.message


def test_dates_times_and_ranges_that_can_match_are_searched() -> None:
    for key, value in [
        ("StudyDate", "20240229"),
        ("StudyDate", "2024.02.29"),
        ("StudyDate", "2025-"),  # a range's end may be a prefix: from 2025 on
        ("StudyDate", "-202412"),
        ("StudyTime", "0930-17"),
        ("AcquisitionDateTime", "20240101120000.5-0500"),  # one value, a UTC offset
        ("AcquisitionDateTime", "2024-20250101"),
    ]:
        assert parse_query([(key, value)], "study").filters[key] == value
    wanted = "20240101120000-0500"
    assert matches([wanted], "AcquisitionDateTime", wanted)
    assert not matches(["20240101115959-0500"], "AcquisitionDateTime", wanted)


@pytest.mark.parametrize("value", ["1.2*", "1.2.?", "1.2.840.10008.*", "abc", "1..2", "1.2,3*"])
def test_a_uid_key_with_a_wildcard_or_no_uid_is_refused(value: str) -> None:
    """UIDs match whole (PS3.4 C.2.2.2.2): ``1.2*`` answered 200 with nothing, as if no
    study under that root had results."""
    with pytest.raises(InvalidRequestError, match="matches whole UIDs"):
        parse_query([("StudyInstanceUID", value)], "studies")


def test_uid_lists_and_universal_matching_are_searched() -> None:
    for value in ("1.2.3", "1.2.3,1.2.4", "1.2.3\\1.2.4", "*", "", "1.2.3, 1.2.4"):
        query = parse_query([("SeriesInstanceUID", value)], "series")
        assert query.filters["SeriesInstanceUID"] == value
