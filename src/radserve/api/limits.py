"""The request stack every radserve app runs under: HEAD as GET, control characters, body
limit, request timeout, HTTP metrics, JSON error bodies, response headers.

A module of its own, not part of :mod:`radserve.api.app`: an API reader process
(:mod:`radserve.api.reader`) wraps its two reads in the same stack, and importing the app
factory for it pulled in every router and, through them, the whole service (inference
runtimes, DICOM and NIfTI writers: ~115 MiB a reader never runs; docs/scaling.md).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from radserve.api.middleware import (
    BodyLimitMiddleware,
    ControlCharactersMiddleware,
    HeadAsGetMiddleware,
    JsonErrorsMiddleware,
    MetricsMiddleware,
    Observe,
    ResponsePolicyMiddleware,
    TimeoutMiddleware,
)
from radserve.config import ServerSettings


def limits(server: ServerSettings, observe: Observe) -> list[tuple[Any, dict[str, Any]]]:
    """The request stack of every radserve app (the serving process's and the reader
    processes'), innermost first: HEAD as GET, control characters, body limit, request timeout,
    HTTP metrics, JSON error bodies, response headers (no-store, HSTS)."""
    return [
        (HeadAsGetMiddleware, {}),
        (ControlCharactersMiddleware, {}),
        (
            BodyLimitMiddleware,
            {"max_bytes": server.max_upload_bytes, "idle_timeout_s": server.request_timeout_s},
        ),
        (
            TimeoutMiddleware,
            {"timeout_s": server.request_timeout_s, "exempt": ("/v1/studies", "/dicomweb/studies")},
        ),
        (MetricsMiddleware, {"observe": observe}),
        (JsonErrorsMiddleware, {}),
        # outermost: its headers on every answer, the error bodies' included
        (ResponsePolicyMiddleware, {}),
    ]


def add_limits(app: FastAPI, server: ServerSettings, observe: Observe) -> None:
    """Install :func:`limits` on ``app`` (Starlette adds each one outside the last)."""
    for middleware, options in limits(server, observe):
        app.add_middleware(middleware, **options)


__all__ = ["add_limits", "limits"]
