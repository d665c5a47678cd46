"""The one Accept rule (api.negotiation), table-driven: which headers a route with one
representation serves, and which get 406 naming its offer."""

from __future__ import annotations

import re

import pytest

from radserve.api.negotiation import check_acceptable
from radserve.media_types import NotAcceptableError

FHIR = ("application/fhir+json",)
JSON = ("application/json",)


@pytest.mark.parametrize(
    ("accept", "offered"),
    [
        (None, FHIR),
        ("*/*", FHIR),
        ("application/*", FHIR),
        ("application/json", FHIR),  # the +json suffix's parent
        ("application/fhir+json; fhirVersion=4.0", FHIR),
        ("text/html, */*;q=0.1", JSON),
        ("application/xml;q=0.9, application/json;q=0.1", JSON),
        ("image/png", ("image/png",)),
        ("", JSON),  # an empty header is as good as none
    ],
)
def test_an_accept_that_allows_the_offer_is_served(accept: str | None, offered: tuple[str]) -> None:
    check_acceptable(accept, offered)


@pytest.mark.parametrize(
    ("accept", "offered"),
    [
        ("application/fhir+xml", FHIR),
        ("application/xml", JSON),
        ("text/*", JSON),
        ("application/json;q=0, */*;q=0", JSON),  # q=0 refuses
        (";;;,,,q=abc", JSON),  # nothing readable: nothing allowed
        ("application/json", ("application/gzip",)),
        ("x" * 5000, JSON),  # past the cached length, parsed each time
    ],
)
def test_an_accept_that_allows_none_of_it_gets_406_naming_the_offer(
    accept: str, offered: tuple[str]
) -> None:
    with pytest.raises(NotAcceptableError, match=re.escape(f"offered as {offered[0]} only")):
        check_acceptable(accept, offered)
