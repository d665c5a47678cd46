"""What pydantic refused, said one way for everything an operator or a model author
writes: settings, gateway overrides, ``model.yaml`` and pipeline files.

pydantic's own text runs over several lines with ``[type=..., input_value=...]`` and a
link after each reason, quotes a pattern's regex, and puts "Value error, " before a
validator's own sentence. Until session 43 the settings, the manifest and the gateway
each turned it into a line their own way (the gateway kept the prefix and the regex).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

_GOT_MAX = 80


def problem_message(error: Any, pattern_words: Mapping[str, str] | None = None) -> str:
    """pydantic's message for one error, without "Value error, ", and a pattern mismatch
    said in words (``pattern_words``: regex -> what it takes) or as the pattern without
    its anchors."""
    if error["type"] != "string_pattern_mismatch":
        return str(error["msg"]).removeprefix("Value error, ")
    pattern = str((error.get("ctx") or {}).get("pattern", ""))
    words = (pattern_words or {}).get(pattern)
    if words is None:
        return f"should match the pattern {pattern.removeprefix('^').removesuffix('$')}"
    return f"should be {words}"


def got_text(value: Any) -> str:
    """A refused value as an author reads it back: its repr, cut to 80 characters."""
    got = repr(value)
    return got if len(got) <= _GOT_MAX else got[: _GOT_MAX - 3] + "..."


def describe_problems(exc: ValidationError) -> str:
    """One ``field: reason (got value)`` per problem, ``; ``-separated. A problem of the
    whole input (a check across fields) or a missing field echoes no input: that would
    be the whole file."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        reason = problem_message(error)
        if not where or error["type"] == "missing":
            problems.append(f"{where}: {reason}" if where else reason)
            continue
        problems.append(f"{where}: {reason} (got {got_text(error.get('input'))})")
    return "; ".join(problems)


__all__ = ["describe_problems", "got_text", "problem_message"]
