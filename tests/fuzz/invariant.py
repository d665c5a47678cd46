"""The one invariant every fuzz target checks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from radserve.errors import RadserveError


class UndeclaredRefusalError(AssertionError):
    """A RadserveError without the code or message its callers show (a finding too)."""


@contextmanager
def refusals_only(*also: type[BaseException]) -> Iterator[None]:
    """Let a declared refusal end the input: a :class:`RadserveError` carrying a code and
    a readable message, or one of ``also`` (a surface's documented outcome, e.g. ingest's
    ``SkipFile``). Anything else propagates, and atheris reports it with the input."""
    try:
        yield
    except RadserveError as exc:
        if not exc.code or not exc.message.strip():
            raise UndeclaredRefusalError(f"{type(exc).__name__} without code or message") from exc
    except also:
        pass


__all__ = ["UndeclaredRefusalError", "refusals_only"]
