"""API keys: roles, generation, and the keyed hash the store keeps instead of the key.

A key is ``rsk_<key id>_<secret>``; the secret is 256 random bits. The store keeps
``HMAC-SHA256(salt, secret)`` with a per-key random salt, never the secret. A slow
password hash (scrypt, PBKDF2) protects *guessable* secrets from offline brute force;
a 256-bit random secret cannot be guessed, so a fast keyed hash gives the same
protection while costing microseconds instead of ~100 ms of CPU on every request
(which would also make verification a denial-of-service lever). The key id in the
token finds the row; the comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

TOKEN_PREFIX = "rsk"
_TOKEN = re.compile(rf"^{TOKEN_PREFIX}_([0-9a-f]{{16}})_([A-Za-z0-9_-]{{43}})$")


class Role(StrEnum):
    """What a key may do. Grants are explicit in :data:`ROLE_GRANTS`."""

    READ = "read"  # job status, results, reports, metrics
    SUBMIT = "submit"  # read + submit studies, cancel its own jobs
    ADMIN = "admin"  # submit + keys, configuration, models, audit export


# admin ⊇ submit ⊇ read: a submitting client must be able to poll what it submitted.
ROLE_GRANTS: Mapping[Role, frozenset[Role]] = {
    Role.READ: frozenset({Role.READ}),
    Role.SUBMIT: frozenset({Role.READ, Role.SUBMIT}),
    Role.ADMIN: frozenset({Role.READ, Role.SUBMIT, Role.ADMIN}),
}


def role_allows(role: Role | str, required: Role | str) -> bool:
    """Whether a key with ``role`` may do something that needs ``required``."""
    return Role(required) in ROLE_GRANTS[Role(role)]


@dataclass(frozen=True)
class NewKey:
    """A freshly generated key: ``token`` is shown once; the store keeps salt and hash."""

    key_id: str
    token: str
    salt: str
    hash: str

    def __repr__(self) -> str:  # never let the token reach a log line by accident
        return f"NewKey(key_id={self.key_id!r}, token='***')"


def generate_key() -> NewKey:
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    return NewKey(
        key_id=key_id,
        token=f"{TOKEN_PREFIX}_{key_id}_{secret}",
        salt=salt,
        hash=hash_secret(secret, salt),
    )


def parse_token(token: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a well-formed token, else None."""
    match = _TOKEN.match(token.strip())
    return (match.group(1), match.group(2)) if match else None


def hash_secret(secret: str, salt: str) -> str:
    return hmac.new(bytes.fromhex(salt), secret.encode(), hashlib.sha256).hexdigest()


def secret_matches(secret: str, salt: str, expected_hash: str) -> bool:
    """Constant-time comparison of the secret's keyed hash with the stored one."""
    return hmac.compare_digest(hash_secret(secret, salt), expected_hash)


# compared against when the key id is unknown, so a miss costs what a hit costs
DUMMY_SALT = "00" * 16
DUMMY_HASH = hash_secret("", DUMMY_SALT)
