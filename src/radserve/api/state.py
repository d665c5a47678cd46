"""The service a request's app serves (set once by :func:`radserve.api.app.create_app`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request

if TYPE_CHECKING:
    from radserve.service import Service


def service_of(request: Request) -> Service:
    return request.app.state.service  # type: ignore[no-any-return]
