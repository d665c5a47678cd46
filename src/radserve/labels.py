"""One line of text naming who did something: an API key's or a console user's name, site
and submitter. Its own module (no radserve imports) so the settings and the keys share
one rule without an import cycle."""

from __future__ import annotations

import unicodedata

__all__ = ["LABEL_MAX", "label_problem", "printable_label"]

# a key's name, site and submitter: one line of text, as long as their columns
LABEL_MAX = 128


def label_problem(value: str) -> str | None:
    """Why ``value`` cannot be a key's name, site or submitter, else None: a control or
    line-separating character (a newline in a name printed a forged row in ``radserve
    keys list`` and the audit trail's tables), or more than :data:`LABEL_MAX`
    characters."""
    if not value.strip():
        return "it is empty"
    if len(value) > LABEL_MAX:
        return f"it is longer than {LABEL_MAX} characters"
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            return f"it holds the control character U+{ord(char):04X}"
    return None


def printable_label(value: str) -> str:
    """``value`` with any control or line-separating character shown as an escape
    (a label stored before they were refused prints on one line)."""
    return "".join(
        char.encode("unicode_escape").decode("ascii")
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")
        else char
        for char in value
    )
