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
