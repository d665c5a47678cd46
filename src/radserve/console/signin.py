"""Console sign-in: an API key, or a local user's name and password (``console.users``),
exchanged for a session (:mod:`radserve.console.sessions`); both give the same cookie,
CSRF token and role checks. Sign-out and the session's details for the page.

Failed sign-ins are audited (``console.signin_failed``: the method and, only when it
names a configured user, the user name, never what was typed as key or password) and
counted per client address (:mod:`radserve.console.limits`): past the limit the client
gets 429 and one ``console.signin_locked`` record. An attempt counts as a failure from
before its key or password is checked until it succeeds, so guesses sent at once cannot
outrun the count.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool

from radserve.api.errors import ForbiddenError, UnauthenticatedError, error_body
from radserve.api.state import service_of
from radserve.audit.chain import AuditEvent
from radserve.audit.events import Action
from radserve.config import ConsoleSettings
from radserve.console.auth import (
    account_check,
    current_session,
    local_users,
    same_origin,
    session_cookie,
)
from radserve.console.limits import SignInLimiter
from radserve.console.routes import phi_allowed
from radserve.console.sessions import CSRF_HEADER, Session, SessionTable, csrf_ok
from radserve.console.users import USER_PREFIX, actor_id
from radserve.passwords import MAX_LENGTH, PasswordHash, verify_password
from radserve.security.keys import Role
from radserve.store import Store

logger = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)


class SignIn(BaseModel):
    """Either ``key`` or ``username`` + ``password``."""

    model_config = ConfigDict(extra="forbid")

    key: str | None = Field(None, min_length=1, max_length=512)
    username: str | None = Field(None, min_length=1, max_length=64)
    password: str | None = Field(None, min_length=1, max_length=MAX_LENGTH)

    @model_validator(mode="after")
    def _one_way(self) -> SignIn:
        by_user = self.username is not None or self.password is not None
        if self.key is not None and by_user:
            raise ValueError("send either an API key or a user name and password, not both")
        if self.key is None and (self.username is None or self.password is None):
            raise ValueError("send an API key, or a user name and a password")
        return self


@dataclass(frozen=True)
class _Identity:
    key_id: str
    role: Role
    name: str | None
    site: str | None = None
    submitter: str | None = None
    user: str | None = None
    user_check: str | None = None


def _limiter(request: Request) -> SignInLimiter:
    return request.app.state.console_limiter  # type: ignore[no-any-return]


def limiter_for(settings: ConsoleSettings, store: Store) -> SignInLimiter:
    return SignInLimiter(
        store, max_failures=settings.signin_max_failures, window_s=settings.signin_window_s
    )


def _audit(request: Request, action: Action, key_id: str | None, payload: dict[str, Any]) -> None:
    service_of(request).store.append_audit(
        AuditEvent(
            action=action,
            subject="console",
            payload=payload,
            actor_key_id=key_id,
            client_address=request.client.host if request.client else None,
        )
    )


def _by_key(request: Request, key: str) -> _Identity | None:
    record = request.app.state.keys.verify(key.strip())
    if record is None:
        return None
    return _Identity(
        record.id, Role(record.role), record.name, record.site, record.submitter, user=None
    )


def _by_password(request: Request, username: str, password: str) -> tuple[_Identity | None, str]:
    """(the identity or None, the configured user name or "" for an unknown one)."""
    users = {u.username.lower(): u for u in local_users(request).current()}
    user = users.get(username.strip().lower())
    stored = PasswordHash.parse(user.password_hash.get_secret_value()) if user else None
    if not verify_password(password, stored) or user is None:
        return None, user.username if user else ""
    who = _Identity(
        actor_id(user),
        Role(user.role),
        user.username,
        user.site,
        user.submitter,
        user=user.username,
        user_check=account_check(user),
    )
    return who, user.username


def _session_body(request: Request, session: Session) -> dict[str, Any]:
    table: SessionTable = request.app.state.console_sessions
    return {
        "role": session.role,
        "key_name": session.key_name,
        "user": session.user,
        # the scope security.visibility compares (a key's, or a local user's)
        "site": session.site,
        "submitter": session.submitter,
        "csrf": session.csrf,
        "phi": phi_allowed(request, Role(session.role)),
        "expires_in_s": round(table.expires_in_s(session)),
        "idle_timeout_s": table.idle_s,
    }


@router.get("/console/api/signin")
async def signin_methods(request: Request) -> Response:
    """How this server lets people sign in (the sign-in page shows the matching forms)."""
    users = await run_in_threadpool(local_users(request).current)
    return JSONResponse({"methods": ["key", *(["password"] if users else [])]})


@router.post("/console/api/session")
async def sign_in(request: Request, body: SignIn) -> Response:
    if not same_origin(request):
        raise ForbiddenError("cross-origin sign-in refused")
    settings = service_of(request).settings
    client = request.client.host if request.client else "unknown"
    limiter = _limiter(request)
    if body.key is None and not await run_in_threadpool(local_users(request).current):
        return JSONResponse(
            error_body(
                "invalid_request",
                "sign-in with a user name is not configured here (console.users)",
            ),
            status_code=400,
        )
    # counted as a failure before anything is checked: guesses sent at once see each other
    attempt = await run_in_threadpool(limiter.take, client)
    if attempt.id is None:
        seconds = max(1, math.ceil(limiter.retry_after(attempt)))
        return JSONResponse(
            error_body(
                "too_many_signins",
                f"too many failed sign-ins from this address; try again in {seconds} s",
                retryable=True,
            ),
            status_code=429,
            headers={"Retry-After": str(seconds)},
        )
    try:
        if body.key is not None:
            method, who, user = "key", await run_in_threadpool(_by_key, request, body.key), ""
        else:
            method = "password"
            who, user = await run_in_threadpool(
                _by_password, request, body.username or "", body.password or ""
            )
    except Exception:  # the server's trouble (a database outage), not the client's guess
        await run_in_threadpool(limiter.forgive, attempt)
        raise
    if who is None:
        # the user name only when it is a configured one: a password typed into the
        # name field must not reach the audit log
        payload: dict[str, Any] = {"method": method, **({"user": user} if user else {})}
        await run_in_threadpool(_audit, request, Action.CONSOLE_SIGNIN_FAILED, None, payload)
        if limiter.blocks(attempt):
            window = settings.console.signin_window_s
            logger.warning(
                "console sign-in: %d failures from one client within %g s; refusing it",
                limiter.max_failures,
                window,
            )
            await run_in_threadpool(
                _audit,
                request,
                Action.CONSOLE_SIGNIN_LOCKED,
                None,
                {"failures": limiter.max_failures, "window_s": window},
            )
        message = (
            "this API key is not valid (unknown or revoked)"
            if method == "key"
            else "unknown user name or wrong password"
        )
        return JSONResponse(error_body("unauthenticated", message), status_code=401)
    await run_in_threadpool(limiter.forgive, attempt)  # it signed in: no failure
    table: SessionTable = request.app.state.console_sessions
    # the session this browser held (another user's, on a shared workstation) ends
    # here: only the new cookie is good after a sign-in (it stayed valid until its idle
    # timeout, for whoever had kept its id)
    await _end_previous(request, table)
    session_id, session = await run_in_threadpool(
        lambda: table.open(
            who.key_id,
            who.role.value,
            key_name=who.name,
            site=who.site,
            submitter=who.submitter,
            user=who.user,
            user_check=who.user_check,
        )
    )
    payload = {"method": method, **({"user": who.user} if who.user else {"key_name": who.name})}
    await run_in_threadpool(_audit, request, Action.CONSOLE_SIGNIN, who.key_id, payload)
    response = JSONResponse(_session_body(request, session))
    name, secure = session_cookie(request)
    response.set_cookie(
        name,
        session_id,
        max_age=int(table.ttl_s),
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/",
    )
    return response


async def _end_previous(request: Request, table: SessionTable) -> None:
    """End the session whose cookie came with a successful sign-in (audited as its
    sign-out) and forget any other id it carried: a sign-in never leaves an earlier
    session open behind the new one."""
    previous = request.cookies.get(session_cookie(request)[0])
    if not previous:
        return
    found = await current_session(request)
    await run_in_threadpool(table.close, previous)
    if found is not None:
        payload = {"ended_by": "signin"}
        await run_in_threadpool(_audit, request, Action.CONSOLE_SIGNOUT, found[1].key_id, payload)


@router.get("/console/api/session")
async def session_info(request: Request) -> Response:
    found = await current_session(request)
    if found is None:
        raise UnauthenticatedError("not signed in (or the session ended)")
    return JSONResponse(_session_body(request, found[1]))


@router.delete("/console/api/session")
async def sign_out(request: Request) -> Response:
    found = await current_session(request)
    if found is not None:
        session_id, session = found
        # as every state-changing request made with the cookie (radserve.console.auth)
        if not same_origin(request):
            raise ForbiddenError("cross-origin sign-out refused (Origin is not this server)")
        if not csrf_ok(session, request.headers.get(CSRF_HEADER)):
            raise ForbiddenError("missing or wrong CSRF token")
        await run_in_threadpool(request.app.state.console_sessions.close, session_id)
        await run_in_threadpool(_audit, request, Action.CONSOLE_SIGNOUT, session.key_id, {})
    response = Response(status_code=204)
    name, secure = session_cookie(request)
    response.delete_cookie(name, path="/", secure=secure, httponly=True, samesite="strict")
    return response


__all__ = ["USER_PREFIX", "SignIn", "limiter_for", "router"]
