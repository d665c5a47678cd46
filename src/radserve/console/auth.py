"""The console session as an API principal: ``app.state.session_principal``.

:func:`radserve.api.auth.require` calls it when a request carries no API key, so every
API endpoint the console uses answers a signed-in browser with the same role checks as
a key (a read session gets 403 from ``DELETE /v1/jobs/{id}``, like a read key). A
state-changing request must also carry the session's CSRF token and, when the browser
sends one, an ``Origin`` of this server.
"""

from __future__ import annotations

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import Principal
from radserve.api.errors import ForbiddenError
from radserve.console.sessions import (
    COOKIE,
    CSRF_HEADER,
    SAFE_METHODS,
    Session,
    SessionTable,
    csrf_ok,
)


def same_origin(request: Request) -> bool:
    """True when the request has no ``Origin`` or one naming this server's host."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") == host


async def current_session(request: Request) -> tuple[str, Session] | None:
    """The request's live session (its API key re-checked now and then), else None."""
    table: SessionTable = request.app.state.console_sessions
    session_id = request.cookies.get(COOKIE)
    session = table.get(session_id)
    if session is None or session_id is None:
        return None
    # a local user's session has no key to re-check: the user list is fixed for the
    # server's life (removing a user takes a restart, which ends every session)
    if session.user is None and table.key_check_due(session):
        store = request.app.state.service.store
        record = await run_in_threadpool(store.get_api_key, session.key_id)
        if record is None or not record.active:
            table.close_key(session.key_id)
            return None
        table.key_checked(session_id)
    return session_id, session


async def session_principal(request: Request) -> Principal | None:
    found = await current_session(request)
    if found is None:
        return None
    _, session = found
    if request.method not in SAFE_METHODS:
        if not same_origin(request):
            raise ForbiddenError("cross-origin request refused (Origin is not this server)")
        if not csrf_ok(session, request.headers.get(CSRF_HEADER)):
            raise ForbiddenError(
                "missing or wrong CSRF token: send the session's token as X-CSRF-Token"
            )
    return Principal(
        session.key_id,
        session.role,
        request.client.host if request.client else None,
        name=session.key_name,
        site=session.site,
        submitter=session.submitter,
    )


__all__ = ["current_session", "same_origin", "session_principal"]
