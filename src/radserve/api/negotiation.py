"""Content negotiation for routes with one representation: 406 before any work when the
request's Accept header allows none of the media types the route answers with.

``GET /v1/jobs/{id}/fhir`` with ``Accept: application/fhir+xml`` was answered with JSON
(a FHIR client that asked for XML then failed to parse the answer). radserve writes each
resource in one format, so a route's offer is what it declares for its success status
(``responses={200: {"content": ...}}``, else its ``response_class``'s media type), and
:class:`NegotiatedRoute` checks it for every route of the routers that use it: one rule,
not a check per route. Routes that offer several representations choose among them
themselves (DICOMweb's WADO-RS) and are checked here only for "at least one".

The Accept header is read by :func:`radserve.media_types.accepted_types`
(the parser DICOMweb's negotiation already uses); ``application/json`` also accepts a
``+json`` type (RFC 6839's structured syntax suffix: ``application/fhir+json``,
``application/dicom+json``), as DICOMweb's own rule did.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import lru_cache
from typing import Any

from fastapi.datastructures import DefaultPlaceholder
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from radserve.media_types import MediaType, NotAcceptableError, accepted_types, is_json

_CACHED_HEADER = 256  # characters; longer Accept headers are parsed each time


def offered_types(route: APIRoute) -> tuple[str, ...]:
    """The media types ``route`` answers its success with; () when it declares none."""
    status = route.status_code or 200
    declared = (route.responses.get(status) or route.responses.get(str(status)) or {}).get(
        "content", {}
    )
    if not declared:
        response_class = route.response_class
        if isinstance(response_class, DefaultPlaceholder):
            response_class = response_class.value
        media = getattr(response_class, "media_type", None)
        declared = [media] if media else []
    return tuple(MediaType.parse(str(media)).type for media in declared)  # no parameters


def _matches(media_range: str, media: str) -> bool:
    if media_range in ("*/*", media):
        return True
    kind, _, subtype = media_range.partition("/")
    if subtype == "*":
        return media.startswith(kind + "/")
    return media_range == "application/json" and is_json(media)


def _acceptable(accept: str, offered: tuple[str, ...]) -> bool:
    return any(_matches(media.type, kind) for media in accepted_types(accept) for kind in offered)


_acceptable_cached = lru_cache(maxsize=256)(_acceptable)


def check_acceptable(accept: str | None, offered: tuple[str, ...]) -> None:
    """Raise :class:`NotAcceptableError` (406) naming the offer when ``accept`` (the
    Accept header, None when absent) allows none of ``offered``."""
    if accept is None or not offered or accept == "*/*":
        return
    ok = (
        _acceptable_cached(accept, offered)
        if len(accept) <= _CACHED_HEADER
        else _acceptable(accept, offered)
    )
    if not ok:
        raise NotAcceptableError(
            f"this resource is offered as {' or '.join(offered)} only; "
            "send an Accept header that allows it (or */*)"
        )


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class NegotiatedRoute(APIRoute):
    """An ``APIRoute`` that refuses (406) a request whose Accept header allows none of
    :func:`offered_types` before its dependencies or endpoint run (no side effect, no
    audited read, no stored upload for an answer the client would not take)."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        offered = offered_types(self)
        if not offered:
            return handler

        async def negotiated(request: Request) -> Response:
            check_acceptable(request.headers.get("accept"), offered)
            return await handler(request)

        return negotiated


__all__ = ["NegotiatedRoute", "check_acceptable", "offered_types"]
