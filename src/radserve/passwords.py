"""Password hashes for the console's local users (``console.users``): scrypt with a
per-user random salt, written by ``radserve console hash-password``.

Why scrypt: it is in the standard library (``hashlib.scrypt``, OpenSSL) and memory-hard,
so a stolen settings file costs an attacker 32 MiB and tens of milliseconds per guess.
The encoded form names its parameters, so stronger ones can be adopted later without
breaking stored hashes: ``scrypt$<log2 N>$<r>$<p>$<salt, base64>$<key, base64>``.
Clear passwords are never stored, logged or returned. A top-level module that imports
nothing of radserve, so the settings can check a hash without an import cycle.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass

PREFIX = "scrypt"
LOG2_N, R, P = 15, 8, 1  # 32 MiB, ~0.1 s on one core
_SALT_BYTES, _KEY_BYTES = 16, 32
MIN_LENGTH, MAX_LENGTH = 8, 1024
# each verification holds 128 * r * N bytes: at most this many at once (a burst of
# sign-ins costs waiting, not memory)
_CONCURRENT = threading.BoundedSemaphore(4)


@dataclass(frozen=True)
class PasswordHash:
    log2_n: int
    r: int
    p: int
    salt: bytes
    key: bytes

    @classmethod
    def parse(cls, encoded: str) -> PasswordHash:
        """The parts of an encoded hash; ValueError naming what is wrong."""
        parts = encoded.strip().split("$")
        if len(parts) != 6 or parts[0] != PREFIX:
            raise ValueError(
                "not a password hash from `radserve console hash-password` "
                "(expected scrypt$<log2 N>$<r>$<p>$<salt>$<key>; never a clear password)"
            )
        try:
            log2_n, r, p = (int(x) for x in parts[1:4])
            salt = base64.b64decode(parts[4], validate=True)
            key = base64.b64decode(parts[5], validate=True)
        except ValueError:
            raise ValueError("password hash: malformed numbers or base64") from None
        if not (14 <= log2_n <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
            raise ValueError("password hash: scrypt parameters out of range (N 2^14..2^20)")
        if len(salt) < 16 or len(key) < 32:
            raise ValueError("password hash: salt or key too short")
        return cls(log2_n, r, p, salt, key)

    def encode(self) -> str:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return f"{PREFIX}${self.log2_n}${self.r}${self.p}${b64(self.salt)}${b64(self.key)}"

    def derive(self, password: str) -> bytes:
        n = 1 << self.log2_n
        with _CONCURRENT:
            return hashlib.scrypt(
                password.encode(),
                salt=self.salt,
                n=n,
                r=self.r,
                p=self.p,
                maxmem=2 * 128 * self.r * n,
                dklen=len(self.key),
            )


def check_password_rules(password: str) -> None:
    """ValueError unless ``password`` may be hashed."""
    if not MIN_LENGTH <= len(password) <= MAX_LENGTH:
        raise ValueError(f"a password has {MIN_LENGTH} to {MAX_LENGTH} characters")


def hash_password(password: str, *, log2_n: int = LOG2_N, r: int = R, p: int = P) -> str:
    """The encoded hash of ``password`` with a fresh random salt."""
    check_password_rules(password)
    shape = PasswordHash(log2_n, r, p, secrets.token_bytes(_SALT_BYTES), b"\0" * _KEY_BYTES)
    return PasswordHash(log2_n, r, p, shape.salt, shape.derive(password)).encode()


# an unknown user name is checked against this, so it costs the same time as a known one
_DUMMY = PasswordHash(LOG2_N, R, P, b"radserve-no-user", b"\0" * _KEY_BYTES)


def verify_password(password: str, stored: PasswordHash | None) -> bool:
    """Whether ``password`` matches ``stored`` (None: an unknown user, always False after
    the same work). Constant-time comparison; call from a worker thread."""
    if len(password) > MAX_LENGTH:
        return False
    target = stored or _DUMMY
    derived = target.derive(password)
    return hmac.compare_digest(derived, target.key) and stored is not None


__all__ = [
    "MAX_LENGTH",
    "MIN_LENGTH",
    "PasswordHash",
    "check_password_rules",
    "hash_password",
    "verify_password",
]
