"""API-key authentication and role checks: one dependency per role.

A key arrives as ``Authorization: Bearer rsk_...`` or ``X-API-Key: rsk_...``. A verified
key is remembered for ``ttl_s`` seconds (keyed by the SHA-256 of the token, never the
token itself) so a status poll costs no database round trip; a revoked key therefore
stops working within ``ttl_s``. Unknown keys are not remembered.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from radserve.api.errors import ForbiddenError, UnauthenticatedError
from radserve.security.keys import Role, role_allows
from radserve.store import ApiKeyRecord, Store

# documented in the OpenAPI schema (see radserve.api.app) and read by token_of()
SECURITY_SCHEMES = {
    "HTTPBearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: `Authorization: Bearer rsk_...`",
    },
    "APIKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}
_MAX_CACHED = 10_000


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's id and role, and the client address (audited)."""

    key_id: str
    role: Role
    client: str | None

    def allows(self, role: Role) -> bool:
        return role_allows(self.role, role)


class KeyVerifier:
    """Token -> key record, with a short memory of verified tokens."""

    def __init__(self, store: Store, *, ttl_s: float = 10.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._known: dict[str, tuple[float, ApiKeyRecord]] = {}
        self._lock = threading.Lock()

    def remembered(self, token: str) -> ApiKeyRecord | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            hit = self._known.get(digest)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def verify(self, token: str) -> ApiKeyRecord | None:
        """Check the token against the store (a database read; call from a thread)."""
        record = self.store.verify_api_key(token)
        if record is not None:
            digest = hashlib.sha256(token.encode()).hexdigest()
            with self._lock:
                if len(self._known) >= _MAX_CACHED:
                    self._known.clear()
                self._known[digest] = (time.monotonic() + self.ttl_s, record)
        return record


def token_of(request: Request) -> str | None:
    """The key sent as ``X-API-Key`` or ``Authorization: Bearer``, if any."""
    headers = request.headers
    token = headers.get("x-api-key")
    if token:
        return token
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credentials.strip() or None


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits keys whose role grants ``role``.

    It reads the headers itself (one dependency, no sub-dependencies: status polls are
    the hot path); :data:`SECURITY_SCHEMES` documents them in the OpenAPI schema."""

    async def dependency(request: Request) -> Principal:
        token = token_of(request)
        if not token:
            raise UnauthenticatedError(
                "this endpoint needs an API key: send `Authorization: Bearer <key>` or "
                "`X-API-Key: <key>` (create one with `radserve keys create`)"
            )
        verifier: KeyVerifier = request.app.state.keys
        record = verifier.remembered(token)
        if record is None:
            record = await run_in_threadpool(verifier.verify, token)
        if record is None:
            raise UnauthenticatedError("the API key is not valid (unknown, malformed or revoked)")
        principal = Principal(
            record.id, Role(record.role), request.client.host if request.client else None
        )
        if not principal.allows(role):
            raise ForbiddenError(
                f"this endpoint needs a key with the {role.value} role; this key has "
                f"{principal.role.value}"
            )
        return principal

    dependency.__name__ = f"require_{role.value}"
    return dependency


require_read = require(Role.READ)
require_submit = require(Role.SUBMIT)
require_admin = require(Role.ADMIN)

__all__ = [
    "SECURITY_SCHEMES",
    "KeyVerifier",
    "Principal",
    "require",
    "require_admin",
    "require_read",
    "require_submit",
    "token_of",
]
