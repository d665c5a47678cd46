"""The API's memory of verified keys (radserve.api.auth.KeyVerifier): a status poll costs
no database read, and a revoked key still stops working within ``ttl_s``. Fake clock,
real store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from radserve.api.auth import KeyVerifier
from radserve.store import ApiKeyRecord, Store, init_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_revoked_key_is_refused_once_its_remembered_verification_expires(
    store: Store,
) -> None:
    clock = FakeClock()
    verifier = KeyVerifier(store, ttl_s=5.0, clock=clock)
    record, token = store.create_api_key(name="poller", role="read")
    assert verifier.remembered(token) is None  # never verified: not remembered
    assert verifier.verify(token) == record
    store.revoke_api_key(record.id)
    clock.now += 4.9
    assert verifier.remembered(token) == record  # the bounded window the TTL allows
    clock.now += 0.2
    assert verifier.remembered(token) is None  # past ttl_s: back to the store ...
    assert verifier.verify(token) is None  # ... which refuses it
    assert verifier.remembered(token) is None  # and a refusal is not remembered


def test_unknown_and_wrong_tokens_are_never_remembered(store: Store) -> None:
    verifier = KeyVerifier(store, ttl_s=60.0, clock=FakeClock())
    _, token = store.create_api_key(name="k", role="read")
    wrong = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for bad in (wrong, "rsk_0000000000000000_" + "A" * 43, "nonsense"):
        assert verifier.verify(bad) is None
        assert verifier.remembered(bad) is None


def test_a_zero_ttl_checks_the_store_on_every_request(store: Store) -> None:
    clock = FakeClock()
    verifier = KeyVerifier(store, ttl_s=0.0, clock=clock)
    record, token = store.create_api_key(name="k", role="read")
    assert verifier.verify(token) == record
    clock.now += 1e-6
    assert verifier.remembered(token) is None


class CountingVerifier(KeyVerifier):
    """The real verifier, counting its store checks."""

    checks = 0

    def verify(self, token: str, *, wait: bool = True) -> ApiKeyRecord | None:
        self.checks += 1
        return super().verify(token, wait=wait)


def test_requests_that_miss_together_check_the_store_once(store: Store) -> None:
    """The connections of one poller whose remembered key ran out miss at once: one
    store check answers all of them (and is remembered for the next)."""
    verifier = CountingVerifier(store, ttl_s=60.0, clock=FakeClock())
    record, token = store.create_api_key(name="poller", role="read")

    async def together() -> list[ApiKeyRecord | None]:
        return await asyncio.gather(*(verifier.checked(token) for _ in range(16)))

    assert asyncio.run(together()) == [record] * 16
    assert verifier.checks == 1
    assert verifier.remembered(token) == record
    assert asyncio.run(verifier.checked("rsk_nonsense")) is None  # a refusal: its own check
    assert verifier.checks == 2
