"""The console session as an API principal: ``app.state.session_principal``.

:func:`radserve.api.auth.require` calls it when a request carries no API key, so every
API endpoint the console uses answers a signed-in browser with the same role checks as
a key (a read session gets 403 from ``DELETE /v1/jobs/{id}``, like a read key). A
state-changing request must also carry the session's CSRF token and, when the browser
sends one, an ``Origin`` of this server.
"""

from __future__ import annotations

import hashlib

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import Principal
from radserve.api.errors import ForbiddenError
from radserve.config import ConsoleUser
from radserve.console.sessions import (
    BACKGROUND_HEADER,
    COOKIE,
    CSRF_HEADER,
    EVENTS_PATH,
    SAFE_METHODS,
    SECURE_COOKIE,
    Session,
    SessionTable,
    csrf_ok,
)
from radserve.console.users import LocalUsers
from radserve.security.keys import Role


def same_origin(request: Request) -> bool:
    """True when the request has no ``Origin`` or one naming this server: its scheme as
    trusted (https with TLS or a trusted proxy's ``X-Forwarded-Proto``) and its host
    (``http://host`` was taken for an HTTPS server)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    scheme, sep, rest = origin.partition("://")
    if not sep:
        return False  # "null" (a sandboxed or file: page) or no origin at all
    host = request.headers.get("host", "")
    return scheme.lower() == request.url.scheme and rest.rstrip("/").lower() == host.lower()


def session_cookie(request: Request) -> tuple[str, bool]:
    """The session cookie's name and Secure flag for ``request``: Secure under
    ``console.secure_cookie``, else when the request came over https as trusted (this
    server's TLS, or a proxy in ``server.trusted_proxies`` that said
    ``X-Forwarded-Proto: https``); a Secure cookie is named :data:`SECURE_COOKIE`. A
    secure request reads only that name: a plain ``radserve_session`` beside it may have
    been planted by another application on the host."""
    secure: bool | None = request.app.state.console_secure_cookie
    if secure is None:
        secure = request.url.scheme == "https"
    return (SECURE_COOKIE if secure else COOKIE), secure


def background(request: Request) -> bool:
    """Whether the page made ``request`` by itself (the live event stream, a refresh or
    poll it marks with ``X-Console-Background: 1``): it does not renew the session's
    idle time, which only a person's actions do."""
    return request.url.path == EVENTS_PATH or request.headers.get(BACKGROUND_HEADER) == "1"


async def current_session(request: Request) -> tuple[str, Session] | None:
    """The request's live session, else None. The store checks its expiry and its API
    key at every request (:class:`SessionTable`); a local user's session ends when this
    server's ``console.users`` no longer has that account as it signed in (removed, its
    role or password changed)."""
    table: SessionTable = request.app.state.console_sessions
    session_id = request.cookies.get(session_cookie(request)[0])
    if not session_id:
        return None
    session = await run_in_threadpool(lambda: table.get(session_id, renew=not background(request)))
    if session is None:
        return None
    if session.user is not None:
        users = await run_in_threadpool(local_users(request).current)
        if session.user_check not in {account_check(u) for u in users}:
            await run_in_threadpool(table.close, session_id)
            return None
    return session_id, session


def local_users(request: Request) -> LocalUsers:
    """This server's ``console.users``, re-read when its settings file changes."""
    return request.app.state.console_users  # type: ignore[no-any-return]


def account_check(user: ConsoleUser) -> str:
    """A fingerprint of a local user's account (name, role, password hash, and its site
    and submitter when it has them), stored with each session it opens: a session whose
    account is gone or changed ends (a user moved to another site sees the other
    site's jobs only after signing in again)."""
    text = f"{user.username.lower()}\n{user.role}\n{user.password_hash.get_secret_value()}"
    if user.site is not None or user.submitter is not None:
        # only then: the sessions of users without a scope stay valid across the upgrade
        text += f"\n{user.site or ''}\n{user.submitter or ''}"
    return hashlib.sha256(text.encode()).hexdigest()


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
        Role(session.role),
        request.client.host if request.client else None,
        name=session.key_name,
        site=session.site,
        submitter=session.submitter,
        session=True,
    )


__all__ = [
    "account_check",
    "background",
    "current_session",
    "local_users",
    "same_origin",
    "session_principal",
]
