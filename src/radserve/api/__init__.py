"""The HTTP API: FastAPI app factory, routers, schemas, auth, and the one error table.

Async lives here only; the service it calls is synchronous and runs on worker threads.

``create_app`` is imported on first use, not with the package: the API's helper
processes (the audit writer of the reader processes, :mod:`radserve.api.audit_writer`)
import a module of this package in a spawned interpreter, and importing the app with it
pulled in every router's dependencies (onnxruntime, pydicom, SciPy, FastAPI):
~240 MiB RSS for a process that only commits audit records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radserve.api.app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from radserve.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["create_app"]
