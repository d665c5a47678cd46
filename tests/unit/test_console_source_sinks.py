"""The console shows server text only as text: its source (console/src) builds every
element with ``h()`` and text nodes, and uses none of the browser's ways to turn a string
into markup or code; the page's policy refuses inline and foreign script besides. A
quick guard for what tests/e2e/test_console_hostile_data.py checks in chromium (slow):
a new ``innerHTML`` fails here at once, before a browser test runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from radserve.console import _CSP

SOURCE = Path(__file__).resolve().parents[2] / "console" / "src"

# a string parsed as HTML or run as code, or a URL that runs script
SINKS = {
    "innerHTML": r"\.innerHTML\b",
    "outerHTML": r"\.outerHTML\s*=",
    "insertAdjacentHTML": r"\binsertAdjacentHTML\b",
    "document.write": r"\bdocument\.write(ln)?\s*\(",
    "eval": r"(?<![\w.])eval\s*\(",
    "Function constructor": r"\bnew\s+Function\s*\(",
    "timer with a string": r"\bset(Timeout|Interval)\s*\(\s*['\"`]",
    "javascript: URL": r"javascript:",
    "srcdoc": r"\bsrcdoc\b",
    "DOMParser": r"\bDOMParser\b",
    "createContextualFragment": r"\bcreateContextualFragment\b",
}


def _sources() -> list[Path]:
    files = sorted(SOURCE.glob("*.js"))
    if not files:
        pytest.skip(f"no console source at {SOURCE} (an installed package, not the repo)")
    return files


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_the_console_source_turns_no_string_into_markup_or_code(sink: str) -> None:
    found = [
        f"{path.name}:{n}: {line.strip()[:100]}"
        for path in _sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(SINKS[sink], line)
    ]
    assert not found, f"{sink} in the console's source (build the DOM with h()): {found}"


def test_element_attributes_named_by_code_only() -> None:
    """``h(tag, attrs)`` turns ``on*`` keys into listeners and sets the rest as
    attributes: its attribute names must be literals, never server text (an object spread
    of server data could name ``onclick`` or ``href``)."""
    spread = [
        f"{path.name}:{n}"
        for path in _sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bh\(\s*['\"]\w+['\"]\s*,\s*\{\s*\.\.\.", line)
    ]
    assert not spread, f"h() attributes spread from data: {spread}"


def test_the_page_policy_allows_no_inline_or_foreign_script() -> None:
    directives = dict(d.strip().split(" ", 1) for d in _CSP.split(";") if d.strip())
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'self'"
    assert "unsafe-eval" not in _CSP
    assert directives["frame-ancestors"] == "'none'" and directives["base-uri"] == "'none'"
